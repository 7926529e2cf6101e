"""The CPU trace's cost per tensor op (issue 11): tracing on vs off, side by side, in one run.

Each op is ``c = a + b`` on two small CPU tensors (16 floats): one allocation and one free
through torch's CPU allocator, the case where a per-allocation cost weighs most. Three
variants run alternately, round after round (the first round is a warm-up, not counted):

- ``off``: nothing of ours installed;
- ``hook``: the CPU source counting (``_core._cpu_start()``), no trace: what a CPU line
  profiler pays, the floor under the trace;
- ``trace``: ``_core._cpu_trace_start(max_entries)``: every allocation's Python stack is read
  (in Rust, GIL taken back as torch's own gatherer does) and interned, and every entry
  appended to the ring buffer.

The ops run ``--depth`` frames below the benchmark's own (default 30, a model's forward is
about that deep), so each stack read walks a realistic stack. We print the median time per
op of each variant, and, against ``off``, the median over rounds of the paired ratio and
difference (rounds next to each other share the machine's drift) with half its
interquartile range. Also printed: the time ``_cpu_trace_stop()`` takes to turn the trace
into a snapshot dict, per entry.

The clock is the main thread's CPU time (``time.thread_time``; torch is set to one intra-op
thread, and everything measured runs on the main thread): on a small shared machine it
leaves out most of the time other processes hold the core. ``--wall`` uses wall time.

    python bench/trace_cpu_cost.py [--ops 100000] [--rounds 7] [--depth 30] [--wall]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

from memlab_rs import _core

clock = time.thread_time


def ops(n: int, a: torch.Tensor, b: torch.Tensor) -> None:
    for _ in range(n):
        c = a + b
        del c


def at_depth(depth: int, n: int, a: torch.Tensor, b: torch.Tensor) -> float:
    if depth == 0:
        start = clock()
        ops(n, a, b)
        return clock() - start
    return at_depth(depth - 1, n, a, b)


def measure(variant: str, n: int, depth: int, a, b) -> tuple[float, dict | None]:
    if variant == "hook":
        assert _core._cpu_start() == "allocator"
    elif variant == "trace":
        _core._cpu_trace_start(4 * n)
    try:
        seconds = at_depth(depth, n, a, b)
    finally:
        trace = None
        if variant == "hook":
            _core._cpu_stop()
        elif variant == "trace":
            trace = _core._cpu_trace_stop()
    return seconds / n, trace


def main() -> None:
    global clock
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--depth", type=int, default=30)
    parser.add_argument("--wall", action="store_true", help="wall time, not thread CPU time")
    args = parser.parse_args()
    if args.wall:
        clock = time.perf_counter
    torch.set_num_threads(1)
    a, b = torch.ones(16), torch.ones(16)
    variants = ["off", "hook", "trace"]
    samples: dict[str, list[float]] = {v: [] for v in variants}
    stops: list[tuple[float, int]] = []
    entries = stack_depth = 0
    for r in range(args.rounds + 1):
        order = variants[r % 3 :] + variants[: r % 3]  # rotate: no variant always first
        for variant in order:
            per_op, trace = measure(variant, args.ops, args.depth, a, b)
            if trace is not None:
                entries = len(trace["device_traces"][0])
                stack_depth = max(len(e["frames"]) for e in trace["device_traces"][0])
                assert trace["memlab_rs"]["no_stack"] == 0
            if r > 0:
                samples[variant].append(per_op)
        if r > 0:  # time one stop on its own: a fresh trace of --ops ops
            _core._cpu_trace_start(4 * args.ops)
            at_depth(args.depth, args.ops, a, b)
            start = time.perf_counter()
            trace = _core._cpu_trace_stop()
            stops.append((time.perf_counter() - start, len(trace["device_traces"][0])))
            del trace

    def paired(name: str, ratio: bool) -> tuple[float, float]:
        values = [
            (x / o if ratio else x - o) for x, o in zip(samples[name], samples["off"], strict=True)
        ]
        q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
        return statistics.median(values), (q3 - q1) / 2

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"CPU trace cost per tensor op: python {platform.python_version()}, torch "
        f"{torch.__version__}, {platform.machine()}, {os.cpu_count()} CPUs, load average "
        f"{load}; {args.ops} ops of a + b (16 floats) per sample, {args.rounds} rounds, "
        f"clock {'wall' if args.wall else 'thread CPU'}"
    )
    print(
        f"each op: 1 allocation + 1 free; trace entries per sample: {entries} "
        f"(3 per op); Python stack depth at the allocation: {stack_depth} frames"
    )
    print(f"{'variant':<8} {'us/op':>8} {'vs off (ratio)':>18} {'added us/op':>16}")
    for name in variants:
        line = f"{name:<8} {statistics.median(samples[name]) * 1e6:8.3f}"
        if name != "off":
            ratio, ratio_noise = paired(name, ratio=True)
            added, added_noise = paired(name, ratio=False)
            line += f" {ratio:9.2f}x ± {ratio_noise:4.2f}"
            line += f" {added * 1e6:9.3f} ± {added_noise * 1e6:5.3f}"
        print(line)
    seconds, count = statistics.median(s for s, _ in stops), stops[0][1]
    print(
        f"_cpu_trace_stop() for {count} entries: {seconds * 1e3:.1f} ms "
        f"({seconds / count * 1e9:.0f} ns per entry)"
    )


if __name__ == "__main__":
    sys.exit(main())
