"""Allocation tracing overhead: training-step time with ``memlab_rs.trace.Tracer`` on against
off, side by side in one run, with torch's own allocation history alone as a reference.

1. GPU (needs CUDA), the workloads of CONTRIBUTING.md: GPT-2 (124M) AdamW at batch 8x512 and
   1x64, ResNet-50 64x3x224x224 SGD with momentum. Variants:
     none                      nothing recording
     torch history alone       _record_memory_history("all", context="alloc", stacks="python")
     Tracer tag_modules=False  memlab_rs.trace.Tracer(device="cuda", model=model) (the default)
     Tracer tag_modules='forward'  with forward and optimizer tags (module hooks)
     Tracer tag_modules=True   with forward, backward and optimizer tags
   Targets for the Tracer rows: <= 1.03x on GPT-2 8x512 and ResNet-50, <= 1.15x on GPT-2 1x64
   (torch's history alone measured about 1.11x there).
   Each round starts a FRESH Tracer (or turns torch's history on), runs --steps training steps
   timed one by one (each ends with torch.cuda.synchronize()), then stops it. Only the steps
   are timed: the stop (torch's snapshot plus our analysis) is timed apart and printed per
   round with the number of history entries it analysed.
2. CPU (memlab_rs's CPU recorder, ``_core._cpu_trace_start``; skipped with a notice where this
   build lacks it): the added cost per tensor op (``x.add(1)`` on a 64-float tensor: one
   allocation and one free), and a small CPU training step (the bundled TinyGPT, as in
   bench/cpu_source.py) with the Tracer on against off. Timed with the thread's CPU time
   (``time.thread_time``; ``--wall`` for wall time), torch on one intra-op thread.

Variants run alternately, round after round (the order rotates; round 0 is a warm-up, not
counted). We print medians of every sample, their ratio to ``none``, and the median over
rounds of the per-round ratio (rounds next to each other share the machine's drift) with half
its interquartile range.

    python bench/trace_overhead.py [--rounds 11] [--steps 5] [--workload gpt2-1x64 ...]
                                   [--quick] [--skip-cpu] [--skip-gpu] [--wall]

``--quick``: one workload (GPT-2 1x64 unless --workload names others), 5 rounds of 3 steps.
The full run takes about 2-3 minutes on an H100; on a machine without CUDA the GPU part says
it needs a GPU and the script exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import os
import platform
import statistics
import sys
import time
import warnings

import torch

import memlab_rs
from memlab_rs import _core
from memlab_rs import trace as mtrace

HAVE_CUDA = torch.cuda.is_available()
HAVE_TAGGER = importlib.util.find_spec("memlab_rs.trace.tags") is not None
HAVE_CPU_TRACER = hasattr(_core, "_cpu_trace_start")
TARGETS = {"gpt2-8x512": 1.03, "gpt2-1x64": 1.15, "resnet50": 1.03}
MAX_ENTRIES = 1_000_000
clock = time.perf_counter  # the CPU section may switch to time.thread_time


class Timings:
    """Samples per variant and per round (from `alternate`)."""

    def __init__(self, rounds: dict[str, list[list[float]]]):
        self.rounds = rounds

    def median(self, name: str) -> float:
        return statistics.median(x for r in self.rounds[name] for x in r)

    def paired(self, name: str, base: str = "none", ratio: bool = True) -> tuple[float, float]:
        """Round by round, `name`'s median over `base`'s (ratio or difference): the median
        over rounds and half the interquartile range."""
        per_round = []
        for mine, theirs in zip(self.rounds[name], self.rounds[base]):
            a, b = statistics.median(mine), statistics.median(theirs)
            per_round.append(a / b if ratio else a - b)
        if len(per_round) < 2:
            return per_round[0], 0.0
        q1, _, q3 = statistics.quantiles(per_round, n=4)
        return statistics.median(per_round), (q3 - q1) / 2


def rotated(items: list, r: int) -> list:
    return items[r % len(items) :] + items[: r % len(items)]


def alternate(variants: dict, run, rounds: int) -> Timings:
    """`run()` under each variant, the variants taking turns round after round (the order
    rotates each round); `run` returns a list of samples. Round 0 is a warm-up."""
    samples: dict[str, list[list[float]]] = {name: [] for name in variants}
    for r in range(rounds + 1):
        for name in rotated(list(variants), r):
            with variants[name]():
                got = run()
            if r > 0:
                samples[name].append(got)
    return Timings(samples)


@contextlib.contextmanager
def nothing():
    yield


class Stops:
    """What stopping each recording cost, and how many entries it held."""

    def __init__(self):
        self.seconds: dict[str, list[float]] = {}
        self.entries: dict[str, list[int]] = {}

    def add(self, name: str, seconds: float, entries: int) -> None:
        self.seconds.setdefault(name, []).append(seconds)
        self.entries.setdefault(name, []).append(entries)


def tracer(stops: Stops, name: str, **kwargs):
    """A fresh Tracer for one round; its stop (snapshot + analysis) is timed into `stops`."""

    @contextlib.contextmanager
    def variant():
        tr = mtrace.Tracer(max_entries=MAX_ENTRIES, **kwargs)
        tr.start()
        try:
            yield
        finally:
            start = time.perf_counter()
            result = tr.stop()
            seconds = time.perf_counter() - start
            stops.add(name, seconds, sum(result.summary(d)["events"] for d in result.devices))

    return variant


@contextlib.contextmanager
def torch_history():
    """torch's own allocation history, as the Tracer turns it on, for one round."""
    torch.cuda.memory._record_memory_history(
        "all", context="alloc", stacks="python", max_entries=MAX_ENTRIES
    )
    try:
        yield
    finally:
        torch.cuda.memory._record_memory_history(None)


def show(title: str, t: Timings, unit: str, scale: float, target: float | None,
         stops: Stops | None = None) -> None:
    base = t.median("none")
    print(f"\n{title}")
    print(f"  {'':<27} {'median':>12}   {'ratio of medians':>16}   "
          f"{'per-round ratio':>15} (+- half IQR)   target")
    for name in t.rounds:
        ratio, noise = t.paired(name)
        verdict = ""
        if target is not None and name.startswith("Tracer"):
            met = t.median(name) / base <= target
            verdict = f"<= {target:.2f}x: {'met' if met else 'NOT met'}"
        elif name.startswith("torch"):
            verdict = "(reference)"
        print(f"  {name:<27} {t.median(name) * scale:8.3f} {unit}   "
              f"{t.median(name) / base:15.3f}x   {ratio:14.3f}x +-{noise:.3f}         {verdict}")
    if stops is not None:
        for name, seconds in stops.seconds.items():
            entries = statistics.median(stops.entries[name])
            print(f"  {name}: stop() per round (snapshot + analysis of a median "
                  f"{entries:,.0f} entries): median {statistics.median(seconds):.3f} s, "
                  f"max {max(seconds):.3f} s")


# 1. GPU --------------------------------------------------------------------------------------


def gpu_workload(name: str, rounds: int, steps: int) -> None:
    from trace_workloads import TITLES, build

    step, model = build(name)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    stops = Stops()
    variants = {
        "none": nothing,
        "torch history alone": torch_history,
        "Tracer tag_modules=False": tracer(
            stops, "Tracer tag_modules=False", device="cuda", model=model, tag_modules=False),
        "Tracer tag_modules='forward'": tracer(
            stops, "Tracer tag_modules='forward'", device="cuda", model=model,
            tag_modules="forward"),
        "Tracer tag_modules=True": tracer(
            stops, "Tracer tag_modules=True", device="cuda", model=model, tag_modules=True),
    }

    def run() -> list[float]:
        timings = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            torch.cuda.synchronize()
            timings.append(time.perf_counter() - start)
        return timings

    t = alternate(variants, run, rounds)
    # The warm-up round's stops are not counted either.
    for variant in stops.seconds:
        del stops.seconds[variant][0], stops.entries[variant][0]
    show(f"1. {TITLES[name]}: training step, median of {rounds} rounds x {steps} steps "
         f"(a fresh Tracer per round)", t, "ms/step", 1e3, TARGETS[name], stops)


# 2. CPU --------------------------------------------------------------------------------------


def cpu_section(rounds: int) -> None:
    print("\n2. CPU tracer")
    if not HAVE_CPU_TRACER:
        print("  CPU tracer not available in this build")
        return
    from memlab_rs.demo import train_step
    from memlab_rs.models import TinyGPT

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.ones(64)
        ops = 20_000

        def op_loop() -> list[float]:
            start = clock()
            for _ in range(ops):
                x.add(1)
            return [(clock() - start) / ops]

        stops = Stops()
        variants = {
            "none": nothing,
            "Tracer tag_modules=False": tracer(
                stops, "Tracer tag_modules=False", device="cpu", tag_modules=False),
        }
        t = alternate(variants, op_loop, rounds)
        added, noise = t.paired("Tracer tag_modules=False", ratio=False)
        print(f"  cost per tensor op, x.add(1) on 64 floats (one allocation and one free), "
              f"rounds of {ops:,} ops, clock {clock.__name__}:")
        print(f"    none                      {t.median('none') * 1e6:7.3f} us/op")
        print(f"    Tracer tag_modules=False  {t.median('Tracer tag_modules=False') * 1e6:7.3f}"
              f" us/op   {added * 1e6:+.3f} +-{noise * 1e6:.3f} us added per op (paired)")

        torch.manual_seed(0)
        config = dict(vocab=500, dim=64, layers=2, heads=4, context=64)
        model = TinyGPT(**config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        tokens = torch.randint(0, config["vocab"], (4, 33))
        for _ in range(5):
            train_step(model, optimizer, tokens)

        def steps() -> list[float]:
            timings = []
            for _ in range(6):
                start = clock()
                train_step(model, optimizer, tokens)
                timings.append(clock() - start)
            return timings

        stops = Stops()
        variants = {
            "none": nothing,
            "Tracer tag_modules=False": tracer(
                stops, "Tracer tag_modules=False", device="cpu", model=model,
                tag_modules=False),
            "Tracer tag_modules=True": tracer(
                stops, "Tracer tag_modules=True", device="cpu", model=model, tag_modules=True),
        }
        t = alternate(variants, steps, rounds)
        shape = ", ".join(f"{k}={v}" for k, v in config.items())
        show(f"  TinyGPT({shape}) training step, batch 4x32, AdamW, {rounds} rounds x 6 steps "
             f"(a fresh Tracer per round; no target)", t, "ms/step", 1e3, None, stops)
    finally:
        torch.set_num_threads(threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--steps", type=int, default=5, help="training steps per round")
    parser.add_argument("--workload", action="append",
                        choices=["gpt2-8x512", "gpt2-1x64", "resnet50"],
                        help="run only these GPU workloads (repeatable)")
    parser.add_argument("--quick", action="store_true",
                        help="one workload (GPT-2 1x64 unless --workload), 5 rounds x 3 steps")
    parser.add_argument("--skip-cpu", action="store_true")
    parser.add_argument("--skip-gpu", action="store_true")
    parser.add_argument("--wall", action="store_true", help="CPU section: wall-clock time")
    args = parser.parse_args()
    rounds, steps = (5, 3) if args.quick else (args.rounds, args.steps)
    workloads = args.workload or (["gpt2-1x64"] if args.quick else list(TARGETS))
    warnings.simplefilter("ignore")
    global clock
    began = time.perf_counter()
    gpu = torch.cuda.get_device_name(0) if HAVE_CUDA else "no GPU"
    print(f"Python {platform.python_version()}, torch {torch.__version__}, {gpu}, "
          f"memlab_rs {memlab_rs.__version__}, {os.cpu_count()} CPUs")
    print(f"module tagger (memlab_rs.trace.tags): "
          f"{'present' if HAVE_TAGGER else 'MISSING: tag_modules=True tags nothing'}; "
          f"CPU recorder: {'present' if HAVE_CPU_TRACER else 'missing'}")
    if not args.skip_gpu:
        if not HAVE_CUDA:
            print("\n1. GPU workloads: this part needs a CUDA GPU; skipped")
        else:
            for name in workloads:
                gpu_workload(name, rounds, steps)
                gc.collect()  # the model and its optimizer went with the call
                torch.cuda.empty_cache()
    if not args.skip_cpu:
        clock = time.perf_counter if args.wall else time.thread_time
        cpu_section(rounds)
    print(f"\n(whole run {time.perf_counter() - began:.0f} s wall)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
