"""The CPU memory source (issue 10): the allocator hook vs the dispatch-mode fallback vs no
profiler, side by side, in one run.

1. Cost of one profiled call of an empty function while 0, 1,000 and 100,000 extra CPU
   tensors are alive (target: flat for the allocator hook; the fallback walks every live
   tensor at each outermost profiled call).
2. A small CPU training step of the bundled TinyGPT, profiled on the step and on
   ``Block.forward``: median step time and its ratio to unprofiled (target: allocator hook
   <= 1.10x on Python 3.12).
3. Cost per CPU allocation: while tracking (``_core._cpu_start()``) vs not (target: <= 0.2
   us added), and nothing once tracking stopped (same as before any start, and no GOT slot
   holds our hook); then inside a profiled function, for both sources.
4. ``torch.compile`` (backend "eager"): the frames dynamo compiles, unprofiled and with the
   caller and the compiled function profiled (target: the same counts for the allocator hook).

Both sources run in this one process: the source is chosen at each tracking start, from
``MEMLAB_RS_CPU_SOURCE`` (``dispatch`` forces the fallback), and each measurement checks
which one it got; section 3 runs first, as it needs a process that never tracked. Variants
run alternately, round after round (the first round is a warm-up, not counted), and we print
medians and, against unprofiled, the median over rounds of the paired difference or ratio
(rounds next to each other share the machine's drift) with half its interquartile range.

Everything measured runs on the main thread (torch is set to one intra-op thread; the hook,
the line profiler and the fallback's mode all run on the allocating thread), so the clock is
that thread's CPU time (``time.thread_time``): on a small shared machine it leaves out most
of the time other processes hold the core, which wall time (``--wall``) does not (time the
hypervisor takes from a virtual CPU may still be counted).

The training step is TinyGPT(vocab=500, dim=64, layers=2) at batch 4x32: a few ms per step
on one core, so per-op costs weigh as they would in a small real CPU job.

    python bench/cpu_source.py [--rounds 15] [--steps 6] [--wall] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import io
import itertools
import os
import platform
import statistics
import sys
import time
import warnings

import torch

import memlab_rs
from memlab_rs import _core
from memlab_rs.demo import train_step
from memlab_rs.models import Block, TinyGPT

SOURCES = {"allocator": None, "dispatch": "dispatch"}  # name -> MEMLAB_RS_CPU_SOURCE
clock = time.thread_time  # see the module doc; main() may switch it to wall time


@contextlib.contextmanager
def source(name: str):
    """Tracking started inside this block uses the source `name`."""
    value = SOURCES[name]
    before = os.environ.pop("MEMLAB_RS_CPU_SOURCE", None)
    if value is not None:
        os.environ["MEMLAB_RS_CPU_SOURCE"] = value
    try:
        yield
    finally:
        os.environ.pop("MEMLAB_RS_CPU_SOURCE", None)
        if before is not None:
            os.environ["MEMLAB_RS_CPU_SOURCE"] = before


@contextlib.contextmanager
def profiled(name: str, *functions):
    """A CPU LineProfiler on `functions`, counting with the source `name` (checked)."""
    with source(name):
        lp = memlab_rs.LineProfiler(*functions, device="cpu")
        with lp:
            mode = _core._cpu_mode() or ""
            if not mode.startswith(name):
                raise RuntimeError(f"asked for the {name} source, got {mode!r}")
            yield lp


@contextlib.contextmanager
def nothing():
    yield None


class Timings:
    """Samples per variant and per round, from `alternate`."""

    def __init__(self, rounds: dict[str, list[list[float]]]):
        self.rounds = rounds

    def median(self, name: str) -> float:
        """The median of every sample of `name`."""
        return statistics.median(x for r in self.rounds[name] for x in r)

    def paired(self, name: str, base: str = "none", ratio: bool = False) -> tuple[float, float]:
        """`name` against `base` round by round (their medians' difference, or ratio), as the
        median over rounds and half the interquartile range (the noise between rounds): rounds
        next to each other share the machine's drift, so pairing them cancels it."""
        per_round = []
        for mine, theirs in zip(self.rounds[name], self.rounds[base]):
            a, b = statistics.median(mine), statistics.median(theirs)
            per_round.append(a / b if ratio else a - b)
        q1, _, q3 = statistics.quantiles(per_round, n=4)
        return statistics.median(per_round), (q3 - q1) / 2


def rotated(items: list, r: int) -> list:
    return items[r % len(items) :] + items[: r % len(items)]


def alternate(variants: dict, run, rounds: int) -> Timings:
    """`run(name)` under each variant, the variants taking turns round after round (the order
    rotates each round). `run` returns a list of samples or one; round 0 is a warm-up."""
    samples: dict[str, list[list[float]]] = {name: [] for name in variants}
    for r in range(rounds + 1):
        for name in rotated(list(variants), r):
            with variants[name]():
                got = run(name)
            if r > 0:
                samples[name].append(got if isinstance(got, list) else [got])
    return Timings(samples)


def empty():
    pass


# 1. ------------------------------------------------------------------------------------------


def per_call_vs_live_tensors(rounds: int, counts: list[int]):
    print("\n1. one profiled call of an empty function, with N extra live CPU tensors "
          "(us per call: medians; added: median over rounds of the paired difference "
          "+- half its IQR)")
    keep: list[torch.Tensor] = []

    def live(count: int) -> None:
        del keep[count:]
        keep.extend(torch.empty(1) for _ in range(count - len(keep)))

    names = ["none", "allocator", "dispatch"]
    variants = {
        "none": nothing,
        "allocator": lambda: profiled("allocator", empty),
        "dispatch": lambda: profiled("dispatch", empty),
    }
    # Per round and count: samples of `calls` calls, ~0.04 s in all where a call is cheap.
    # The fallback's call (a walk of every live object: 0.1 ms to 0.5 s) is timed once
    # first, for samples of ~0.02 s where that allows and one single call where not.
    calls = {(name, count): 2000 for name in names for count in counts}
    samples = {(name, count): 20 for name in names for count in counts}
    for count in counts:
        live(count)
        with profiled("dispatch", empty):
            empty()
            start = clock()
            empty()
            once = clock() - start
        calls["dispatch", count] = n = max(1, min(200, int(0.02 / once)))
        samples["dispatch", count] = max(1, min(10, int(0.2 / (once * n))))

    def run(name: str, count: int) -> list[float]:
        empty()  # the fallback's first call after enable() also adopts every storage
        n, got = calls[name, count], []
        for _ in range(samples[name, count]):
            start = clock()
            for _ in range(n):
                empty()
            got.append((clock() - start) / n)
        return got

    # Counts and variants both take turns, round after round: the counts are compared
    # round by round too, so the machine's drift during the run cancels out of flatness.
    timings: dict[str, list[list[float]]] = {f"{n} {c}": [] for n in names for c in counts}
    for r in range(rounds + 1):
        for count in rotated(counts, r):
            live(count)
            for name in rotated(names, r):
                with variants[name]():
                    got = run(name, count)
                if r > 0:
                    timings[f"{name} {count}"].append(got)
    del keep[:]
    t = Timings(timings)
    print(f"  {'N live':>8} {'none':>7} {'allocator':>9} {'dispatch':>11}   "
          f"{'allocator added':>19}   {'dispatch added':>19}")
    for c in counts:
        (ours, ours_noise) = t.paired(f"allocator {c}", f"none {c}")
        (theirs, theirs_noise) = t.paired(f"dispatch {c}", f"none {c}")
        print(f"  {c:>8} {t.median(f'none {c}') * 1e6:7.3f} "
              f"{t.median(f'allocator {c}') * 1e6:9.3f} {t.median(f'dispatch {c}') * 1e6:11.1f}"
              f"   {ours * 1e6:+10.3f} +-{ours_noise * 1e6:5.3f}"
              f"   {theirs * 1e6:+10.1f} +-{theirs_noise * 1e6:5.1f}")
    for c in counts[1:]:
        ours, ours_noise = t.paired(f"allocator {c}", f"allocator {counts[0]}", ratio=True)
        theirs, theirs_noise = t.paired(f"dispatch {c}", f"dispatch {counts[0]}", ratio=True)
        print(f"  {c:,} vs {counts[0]:,} live tensors, per call (per-round ratio): allocator "
              f"{ours:.2f}x +-{ours_noise:.2f}, dispatch {theirs:.0f}x +-{theirs_noise:.0f}")
    gc.collect()


# 2. ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def tracking_only():
    """The allocator hook counting, with no line profiler."""
    with source("allocator"):
        mode = _core._cpu_start()
    try:
        if mode != "allocator":
            raise RuntimeError(f"_cpu_start() gave {mode!r}, not the allocator hook")
        yield
    finally:
        _core._cpu_stop()


def training_step(rounds: int, steps: int, batch: int, seq: int, config: dict):
    torch.manual_seed(0)
    model = TinyGPT(**config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, config["vocab"], (batch, seq + 1))
    for _ in range(5):
        train_step(model, optimizer, tokens)
    variants = {
        "none": nothing,
        "hook only (_cpu_start)": tracking_only,
        "allocator step": lambda: profiled("allocator", train_step),
        "allocator step+block": lambda: profiled("allocator", train_step, Block.forward),
        "dispatch step+block": lambda: profiled("dispatch", train_step, Block.forward),
    }

    def run(name):
        timings = []
        for _ in range(steps if name.startswith(("none", "hook", "allocator")) else 2):
            start = clock()
            train_step(model, optimizer, tokens)
            timings.append(clock() - start)
        return timings

    t = alternate(variants, run, rounds)
    with tracking_only():
        before = dict(_core._cpu_stats())["allocation.all.allocated"]
        train_step(model, optimizer, tokens)
        allocations = dict(_core._cpu_stats())["allocation.all.allocated"] - before
    shape = ", ".join(f"{k}={v}" for k, v in config.items())
    print(f"\n2. TinyGPT({shape}) training step, batch {batch}x{seq} tokens, AdamW; "
          f"{rounds} rounds of {steps} steps (dispatch: 2)")
    print(f"  {'':<22} {'median':>9}   {'ratio of medians':>16}   "
          "per-round ratio (median +- half IQR)")
    base = t.median("none")
    for name in variants:
        ratio, noise = t.paired(name, ratio=True)
        print(f"  {name:<22} {t.median(name) * 1e3:6.3f} ms   {t.median(name) / base:15.3f}x"
              f"   {ratio:6.3f}x +-{noise:.3f}")
    print(f"  CPU allocations per step, counted by the hook: {allocations:,}")


# 3. ------------------------------------------------------------------------------------------

ALLOC_ELEMENTS = 4  # torch.empty(4): 16 bytes, one posix_memalign and one free each


def allocate(n: int) -> None:
    """n CPU allocations (each freed at once), the loop in C: one line, so a profiled call
    of it costs a handful of line events however large n is."""
    collections.deque(map(torch.empty, itertools.repeat(ALLOC_ELEMENTS, n)), maxlen=0)


def timed_allocations(n: int) -> float:
    start = clock()
    allocate(n)
    return (clock() - start) / n


def ours_in_slots() -> list[str]:
    return [name for name, _relro, ours in _core._cpu_hook_slots() if ours]


def per_allocation(rounds: int, n: int):
    print(f"\n3. one CPU allocation, torch.empty({ALLOC_ELEMENTS}) freed at once "
          f"(us per allocation, median of rounds of {n:,}; added: paired, as in 1.)")
    if _core._cpu_mode() is not None or ours_in_slots():
        raise RuntimeError("section 3 must run before anything starts tracking")
    for _ in range(5):
        allocate(n)  # warm up
    before = [timed_allocations(n) for _ in range(rounds)]
    slots_before = _core._cpu_hook_slots()

    counted: list[int] = []

    @contextlib.contextmanager
    def tracking():
        with tracking_only():
            first = dict(_core._cpu_stats())["allocation.all.allocated"]
            yield
            counted.append(dict(_core._cpu_stats())["allocation.all.allocated"] - first)

    t = alternate({"tracking": tracking, "stopped": nothing},
                  lambda _name: timed_allocations(n), rounds)
    added, noise = t.paired("tracking", "stopped")
    q1, _, q3 = statistics.quantiles(before, n=4)
    leftover = ours_in_slots()
    print(f"  before any start             {statistics.median(before) * 1e6:7.3f} us "
          f"(+-{(q3 - q1) / 2 * 1e6:.3f} half IQR)")
    print(f"  tracking (_cpu_start)        {t.median('tracking') * 1e6:7.3f} us   "
          f"{added * 1e6:+.3f} +-{noise * 1e6:.3f} us added")
    print(f"  after _cpu_stop              {t.median('stopped') * 1e6:7.3f} us   "
          f"{(t.median('stopped') - statistics.median(before)) * 1e6:+.3f} us vs before any "
          "start (not paired: that one ran first)")
    print(f"  the hook counted {min(counted):,}-{max(counted):,} allocations per tracked "
          f"round of {n:,}")
    print(f"  GOT slots (name, in RELRO, holds our hook) before any start: {slots_before}")
    print(f"  GOT slots after _cpu_stop: {_core._cpu_hook_slots()}: "
          f"{'ours in ' + ', '.join(leftover) if leftover else 'none holds our hook'}")

    variants = {
        "none": nothing,
        "allocator": lambda: profiled("allocator", allocate),
        "dispatch": lambda: profiled("dispatch", allocate),
    }
    t = alternate(variants, lambda name: timed_allocations(n // 10 if name == "dispatch" else n),
                  rounds)
    print(f"  inside a profiled function (the allocations on one line; dispatch: rounds of "
          f"{n // 10:,}):")
    for name in variants:
        added, noise = t.paired(name)
        print(f"    {name:<26} {t.median(name) * 1e6:7.3f} us   "
              f"{added * 1e6:+.3f} +-{noise * 1e6:.3f} us added")


# 4. ------------------------------------------------------------------------------------------


def compiled_fn(x):
    y = torch.sin(x)
    z = y * 2 + 1
    return z.relu()


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        return torch.tanh(h) + 1


def caller(fn, module, x):
    a = fn(x)
    b = module(x)
    return a + b


def compile_frames():
    import torch._dynamo
    from torch._dynamo.utils import counters

    print("\n4. torch.compile(backend='eager') of a function and a module, called 3 times "
          "from a caller; profiled: the caller, the function and Module.forward")
    torch.manual_seed(0)
    module, x = Small(), torch.randn(4, 8)
    results = {}
    for name in ("none", "allocator", "dispatch"):
        torch._dynamo.reset()
        counters.clear()
        fn = torch.compile(compiled_fn, backend="eager")
        mod = torch.compile(module, backend="eager")
        variant = nothing() if name == "none" else profiled(
            name, caller, compiled_fn, Small.forward)
        with variant:
            outs = [caller(fn, mod, x) for _ in range(3)]
        frames = dict(counters["frames"])
        graphs = counters["stats"]["unique_graphs"]
        results[name] = (frames.get("total", 0), frames.get("ok", 0), graphs)
        same = all(torch.equal(o, caller(compiled_fn, module, x)) for o in outs)
        print(f"  {name:<10} frames compiled {frames.get('ok', 0)} of {frames.get('total', 0)}"
              f" seen, graphs {graphs}; results equal eager: {same}")
    torch._dynamo.reset()
    verdict = "equal" if results["allocator"] == results["none"] else "DIFFERENT"
    print(f"  allocator vs unprofiled: {verdict}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=6, help="training steps per round")
    parser.add_argument("--wall", action="store_true", help="time with wall clock")
    parser.add_argument("--quick", action="store_true", help="3 rounds, to try the script")
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds
    warnings.simplefilter("ignore")
    global clock
    clock = time.perf_counter if args.wall else time.thread_time
    torch.set_num_threads(1)
    began = time.perf_counter()
    hook = "sys.monitoring" if sys.version_info >= (3, 12) else "C trace function"
    print(f"Python {platform.python_version()}, torch {torch.__version__}, "
          f"{platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"torch intra-op threads: {torch.get_num_threads()}; line events: {hook}; "
          f"clock: {clock.__name__}")
    per_allocation(rounds * 3, 20_000)  # first: it needs a process that never tracked
    per_call_vs_live_tensors(rounds, [0, 1_000, 100_000])
    training_step(rounds * 3, args.steps, batch=4, seq=32,
                  config=dict(vocab=500, dim=64, layers=2, heads=4, context=64))
    with contextlib.redirect_stderr(io.StringIO()):  # dynamo's warnings about the mode
        compile_frames()
    print(f"\n(whole run {time.perf_counter() - began:.0f} s wall; load average at the end "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())})")


if __name__ == "__main__":
    main()
