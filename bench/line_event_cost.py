"""Where one profiled line's time goes, on CUDA: the stats binding, the peak reset, and the
whole profiler path (memlab_rs on CUDA and on CPU), per line event, side by side.

    python bench/line_event_cost.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

import memlab_rs


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


def per_call(fn, n=2000, repeats=7):
    best = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best.append((time.perf_counter() - start) / n)
    return statistics.median(best)


def main():
    have_cuda = torch.cuda.is_available()
    if have_cuda:
        keep = [torch.empty(1 << k, device="cuda") for k in range(10, 24)]  # noqa: F841
        stats = torch._C._cuda_memoryStats
        reset = torch._C._cuda_resetPeakMemoryStats
        print(f"torch._C._cuda_memoryStats(0)        {per_call(lambda: stats(0)) * 1e6:7.2f} us")
        print(f"torch._C._cuda_resetPeakMemoryStats  {per_call(lambda: reset(0)) * 1e6:7.2f} us")
        print(f"torch.cuda.memory_stats()            "
              f"{per_call(torch.cuda.memory_stats, 500) * 1e6:7.2f} us")
    base = per_call(lines20)
    events = 23  # start, 21 lines, return: each one a sample
    runs = [("cpu", None)] + ([("cuda:0", None), ("cuda:0", "binding")] if have_cuda else [])
    for device, forced in runs:
        if forced:
            os.environ["MEMLAB_RS_CUDA_STATS"] = forced
        with memlab_rs.LineProfiler(lines20, device=device) as lp:
            cost = per_call(lines20)
            reader = lp.stats_reader
        os.environ.pop("MEMLAB_RS_CUDA_STATS", None)
        extra = (cost - base) / events * 1e6
        print(f"memlab_rs per line event, {device:<6} {extra:7.2f} us  ({reader})")
    if have_cuda and sys.version_info >= (3, 12):
        mon = sys.monitoring
        tool = 5
        mon.use_tool_id(tool, "proto")

        def on_line(code, line):
            stats(0)
            reset(0)

        mon.register_callback(tool, mon.events.LINE, on_line)
        mon.set_local_events(tool, lines20.__code__, mon.events.LINE)
        cost = per_call(lines20)
        mon.set_local_events(tool, lines20.__code__, 0)
        mon.register_callback(tool, mon.events.LINE, None)
        mon.free_tool_id(tool)
        print(f"prototype (Python callback: stats + reset) {(cost - base) / 20 * 1e6:7.2f} us")


if __name__ == "__main__":
    main()
