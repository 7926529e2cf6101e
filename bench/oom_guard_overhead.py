"""Out-of-memory guard overhead: training-step time with ``memlab_rs.oom_guard`` on against
off, side by side in one run, on the GPU workloads of bench/line_profiler_overhead.py (GPT-2
124M AdamW at 8x512 and 1x64, ResNet-50 64x3x224x224 SGD momentum).

Variants, alternating round after round (the order rotates; round 0 is a warm-up):
    none                    nothing
    oom_guard               memlab_rs.oom_guard(): target <= 1.01x
    torch history alone     torch.cuda.memory._record_memory_history(max_entries=100000)
    oom_guard(history)      memlab_rs.oom_guard(history=True): what torch's history costs
Each round enters the variant, runs --steps steps timed one by one (each ends with
torch.cuda.synchronize()) and leaves it. We print the median step, its ratio to ``none``,
and the median over rounds of the per-round ratio with half its interquartile range.

    python bench/oom_guard_overhead.py [--rounds 9] [--steps 5] [--workload gpt2-1x64 ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trace_workloads  # noqa: E402

import memlab_rs  # noqa: E402

TARGET = 1.01


@contextlib.contextmanager
def torch_history():
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        yield
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


VARIANTS = {
    "none": contextlib.nullcontext,
    "oom_guard": lambda: memlab_rs.oom_guard(summary=False),
    "torch history alone": torch_history,
    "oom_guard(history)": lambda: memlab_rs.oom_guard(history=True, summary=False),
}


def measure(name: str, rounds: int, steps: int) -> None:
    step, _ = trace_workloads.build(name)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    samples: dict[str, list[list[float]]] = {v: [] for v in VARIANTS}
    order = list(VARIANTS)
    for r in range(rounds + 1):
        order = order[1:] + order[:1]
        for variant in order:
            times = []
            with VARIANTS[variant]():
                for _ in range(steps):
                    start = time.perf_counter()
                    step()
                    torch.cuda.synchronize()
                    times.append(time.perf_counter() - start)
            if r:  # round 0 warms up
                samples[variant].append(times)
    base = statistics.median(x for s in samples["none"] for x in s)
    print(f"\n{trace_workloads.TITLES[name]}: {rounds} rounds x {steps} steps")
    print(f"  {'variant':<22}{'median ms':>10}{'ratio':>8}{'paired':>9}{'+-':>7}")
    for variant, rows in samples.items():
        med = statistics.median(x for s in rows for x in s)
        per = sorted(
            statistics.median(a) / statistics.median(b) for a, b in zip(rows, samples["none"])
        )
        q = statistics.quantiles(per, n=4) if len(per) > 1 else [per[0]] * 3
        note = ""
        if variant == "oom_guard":
            verdict = "met" if statistics.median(per) <= TARGET else "NOT met"
            note = f"  target <= {TARGET:.2f}x: {verdict}"
        print(
            f"  {variant:<22}{med * 1e3:>10.2f}{med / base:>8.3f}x{statistics.median(per):>8.3f}x"
            f"{(q[2] - q[0]) / 2:>7.3f}{note}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--workload", action="append", choices=trace_workloads.WORKLOADS)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("oom_guard_overhead: needs a CUDA GPU (the guard's cost is on CUDA steps)")
        return
    print(
        f"{torch.cuda.get_device_name()} | torch {torch.__version__} | "
        f"python {platform.python_version()} | memlab_rs {memlab_rs.__version__}"
    )
    for name in args.workload or trace_workloads.WORKLOADS:
        measure(name, args.rounds, args.steps)


if __name__ == "__main__":
    main()
