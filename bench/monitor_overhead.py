"""Training monitor overhead: step time with ``memory_profiler`` recording every step vs
without, side by side.

GPU (when CUDA is available): the workloads of bench/trace_workloads.py (GPT-2 124M AdamW at
8x512 and 1x64, ResNet-50 64x3x224x224 SGD momentum), optimizer state counted. CPU (always):
the bundled TinyGPT at 2x64 tokens (CPU-bound, like GPT-2 1x64 on a GPU), timed in the
training thread's CPU time, so the script prints something on a machine without a GPU too.
Target: <= 1.03x. Variants: the monitor as shipped (``feature_maps="auto"``: saved-tensor
hooks only while the step changes, here its first three steps), the monitor measuring every
step (``feature_maps="every"``), and "hooks only": the cheapest saved-tensor hook pair that
makes no reference cycle (a leaf as is, anything else ``t.detach()``) and nothing else, what
torch's hook mechanism alone costs, the floor of any monitor that sees every saved tensor
through ``saved_tensors_hooks``. A new monitor is made for each round of ``--steps``
steps: the median is the steady state, the mean includes each monitor's measured steps.

The variants alternate round after round, each taking each place in a round in turn (the
machines drift by several percent between runs); each step is timed to its end
(``torch.cuda.synchronize()``). We print the medians and their ratio, the "paired" ratio
(the median over rounds of each round's variant median over that round's plain median),
the monitor's own cost per step, and the ratio of the means.

    python bench/monitor_overhead.py [--rounds 9] [--steps 10] [--skip-gpu]
"""

from __future__ import annotations

import argparse
import inspect
import io
import os
import platform
import statistics
import sys
import time

import torch

import memlab_rs
from memlab_rs._categories import CATEGORIES

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def timed_steps(train_step, steps: int, sync, clock, monitor=None) -> list[float]:
    times = []
    for _ in range(steps):
        t0 = clock()
        train_step()
        if monitor is not None:
            monitor.record_stats()
        sync()
        times.append(clock() - t0)
    return times


def _floor_pack(t: torch.Tensor):
    return t if t.is_leaf else t.detach()


def _floor_unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def compare(name: str, train_step, model, optimizer, rounds: int, steps: int, sync, clock) -> None:
    for _ in range(3):  # warm up: allocator, kernels, optimizer state
        train_step()
    sync()
    times: dict[str, list[float]] = {"plain": [], "hooks": [], "auto": [], "every": []}
    paired: dict[str, list[float]] = {"hooks": [], "auto": [], "every": []}
    last = None
    order = list(times)
    for r in range(rounds):
        medians = {}
        for key in order[r % 4 :] + order[: r % 4]:  # each variant takes each place in turn
            if key == "plain":
                t = timed_steps(train_step, steps, sync, clock)
            elif key == "hooks":
                with torch.autograd.graph.saved_tensors_hooks(_floor_pack, _floor_unpack):
                    t = timed_steps(train_step, steps, sync, clock)
            else:
                with memlab_rs.memory_profiler(
                    model, optimizer=optimizer, file=io.StringIO(), feature_maps=key
                ) as monitor:
                    t = timed_steps(train_step, steps, sync, clock, monitor)
                if key == "auto":
                    last = monitor.rows()[-1]
                    assert last["feature_maps_from"] is not None, last
            times[key] += t
            medians[key] = statistics.median(t)
        for key in paired:
            paired[key].append(medians[key] / medians["plain"])
    a = statistics.median(times["plain"])
    mean_a = statistics.fmean(times["plain"])
    print(f"{name:<42} step {a * 1e3:8.2f} ms (median; mean {mean_a * 1e3:.2f} ms)")
    labels = {
        "auto": "monitor (feature_maps='auto')",
        "every": "monitor (feature_maps='every')",
        "hooks": "saved-tensor hooks only",
    }
    for key in ("auto", "every", "hooks"):
        b, mean_b = statistics.median(times[key]), statistics.fmean(times[key])
        print(
            f"{'':<4}{labels[key]:<38} median {b * 1e3:8.2f} ms  ratio {b / a:5.3f}x  "
            f"paired {statistics.median(paired[key]):5.3f}x  cost {1e3 * (b - a):+.3f} "
            f"ms/step  mean ratio {mean_b / mean_a:5.3f}x"
        )
    assert last is not None
    cats = ", ".join(f"{c} {last[c] / 2**20:.1f}" for c in CATEGORIES)
    print(
        f"{'':<4}peak allocated {last['peak_allocated'] / 2**20:.1f} MiB in the "
        f"{last['peak_window']} window = {cats} (MiB); feature maps "
        f"{last['feature_maps'] / 2**20:.1f} MiB (measured at step {last['feature_maps_from']})"
    )


def optimizer_of(train_step):
    return inspect.getclosurevars(train_step).nonlocals["opt"]


def cpu_workload():
    from memlab_rs.models import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(vocab=1000, dim=128, layers=4, heads=4, context=128)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1000, (2, 64))

    def train_step():
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return train_step, model, opt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--skip-gpu", action="store_true")
    args = parser.parse_args()
    print(
        f"memlab_rs {memlab_rs.__version__}, torch {torch.__version__}, Python "
        f"{platform.python_version()}, {args.rounds} rounds x {args.steps} steps per variant"
    )
    # CPU: one torch thread, timed in that thread's CPU time (time.thread_time), so other
    # processes on a shared machine do not show; the backward runs on this thread too.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    step, model, opt = cpu_workload()
    compare(
        "CPU TinyGPT 2x64 AdamW (thread CPU time)",
        step,
        model,
        opt,
        args.rounds,
        args.steps,
        lambda: None,
        time.thread_time,
    )
    torch.set_num_threads(threads)
    if args.skip_gpu or not torch.cuda.is_available():
        print("GPU: skipped (no CUDA)" if not args.skip_gpu else "GPU: skipped (--skip-gpu)")
        return
    import trace_workloads

    print(f"GPU: {torch.cuda.get_device_name(0)}")
    for name in trace_workloads.WORKLOADS:
        step, model = trace_workloads.build(name)
        compare(
            trace_workloads.TITLES[name],
            step,
            model,
            optimizer_of(step),
            args.rounds,
            args.steps,
            torch.cuda.synchronize,
            time.perf_counter,
        )
        del step, model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
