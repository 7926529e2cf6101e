"""What profilers made and dropped earlier cost the ones that come after: a profiled call
after N ``LineProfiler``s were created and dropped (or created and kept, disabled), against
the same call before any, side by side; the loop that makes a profiler per step, its first
steps against its last; the process's resident memory grown per 1,000 profilers dropped.

Every state is measured in this one process, medians of rounds quoted, in the thread's CPU
time (``time.thread_time``: what other processes on a shared machine do shows less). The CPU
source: no GPU needed.

    python bench/line_profiler_churn.py [--profilers 40000] [--calls 10000]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time

import torch

import memlab_rs
from memlab_rs import LineProfiler


def lines20():
    a = 1
    b = a
    c = b
    d = c
    e = d
    f = e
    g = f
    h = g
    i = h
    j = i
    k = j
    m = k
    n = m
    o = n
    p = o
    q = p
    r = q
    s = r
    t = s
    return t


def rss_bytes() -> int:
    """The resident set now (not the peak: memory given back counts as given back)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def profiled_call_seconds(calls: int, budget: float = 1.0) -> float:
    """Seconds per call of ``lines20`` profiled by a fresh profiler (enabled, then dropped):
    ``calls`` calls, fewer (10 at least) where they would take over ``budget`` seconds."""
    with LineProfiler(lines20, device="cpu"):
        start = time.thread_time()
        done = 0
        while done < calls:
            lines20()
            done += 1
            if done >= 10 and time.thread_time() - start > budget:
                break
        return (time.thread_time() - start) / done


def median_call(calls: int, rounds: int) -> float:
    return statistics.median(profiled_call_seconds(calls) for _ in range(rounds))


def steps_seconds(steps: int = 300, rounds: int = 5) -> float:
    """Seconds per step of a loop that makes a profiler per step (the user's pattern): the
    median of ``rounds`` rounds of ``steps`` steps."""

    def one_round() -> float:
        start = time.thread_time()
        for _ in range(steps):
            with LineProfiler(lines20, device="cpu"):
                lines20()
        return (time.thread_time() - start) / steps

    return statistics.median(one_round() for _ in range(rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profilers", type=int, default=40_000)
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    n, calls = args.profilers, args.calls
    torch.set_num_threads(1)
    print(
        f"python {platform.python_version()} torch {torch.__version__} memlab_rs "
        f"{memlab_rs.__version__} on {platform.machine()}, {os.cpu_count()} cpus, load "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    events = 22  # the start, 20 lines, the return
    for _ in range(3):  # warm up: the CPU source, the hooks, the code paths, the caches
        profiled_call_seconds(calls)

    rows = []
    none = median_call(calls, args.rounds)
    rows.append(("no profiler made before", none))

    first_steps = steps_seconds()  # the per-step loop, at its start

    gc.collect()
    before = rss_bytes()
    for _ in range(n):
        LineProfiler(lines20, device="cpu")  # created and dropped at once
    gc.collect()
    grown = rss_bytes() - before
    dropped = median_call(calls, args.rounds)
    rows.append((f"{n:,} created and dropped before", dropped))

    last_steps = steps_seconds()  # the same loop, N profilers later

    kept = [LineProfiler(lines20, device="cpu") for _ in range(n)]
    alive = median_call(calls, args.rounds)
    rows.append((f"{n:,} alive, disabled", alive))
    del kept
    gc.collect()
    again = median_call(calls, args.rounds)
    rows.append((f"those {n:,} dropped too", again))

    print(f"\n1. one profiled call of a 20-line function ({calls:,} calls a round, or what "
          f"fits in a second; median of {args.rounds} rounds)")
    print(f"  {'state':<36}{'us/call':>10}{'us/event':>10}{'ratio':>9}")
    for label, seconds in rows:
        print(f"  {label:<36}{seconds * 1e6:10.2f}{seconds / events * 1e6:10.3f}"
              f"{seconds / none:8.2f}x")
    print("\n2. a loop that makes, enables and drops a profiler per step (median of 5 rounds "
          "of 300 steps)")
    print(f"  {'at its start':<36}{first_steps * 1e6:10.1f} us/step")
    print(f"  {f'after {n:,} more profilers':<36}{last_steps * 1e6:10.1f} us/step"
          f"{last_steps / first_steps:8.2f}x")
    print("\n3. resident memory after creating and dropping them")
    print(f"  {grown / 2**20:.2f} MiB for {n:,} profilers: {grown / n * 1000 / 1024:.1f} KiB "
          "per 1,000")
    if sys.version_info < (3, 12):
        print("\nline events: the C trace function (3.9-3.11)")


if __name__ == "__main__":
    main()
