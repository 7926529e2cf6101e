"""The line profiler on CUDA: per-line numbers equal what torch reports for the same lines.

The reference runs the same statements with ``torch.cuda.memory_stats()`` and
``torch.cuda.reset_peak_memory_stats()`` between them (pytorch_memlab's definition of a
line's peak), from the same allocator state (``empty_cache()`` before each run).
"""

from __future__ import annotations

import pytest
import torch

from memlab_rs import LineProfiler, _core

pytestmark = pytest.mark.cuda

MiB = 1 << 20
COLUMNS = (
    "active_bytes.all.peak",
    "reserved_bytes.all.peak",
    "allocated_bytes.all.allocated",
    "active_bytes.all.current",
)


def work(dev):
    a = torch.empty(3 * MiB, dtype=torch.uint8, device=dev)
    b = torch.empty(700, 1024, device=dev)
    c = a.float()
    del a
    d = (b @ b.T).sum()
    e = torch.empty(10, device=dev)
    return c, d, e


def reference(dev):
    """`work`, statement by statement, reading torch's own statistics after each."""
    seen = []
    last = {}

    def mark():
        # peaks since the last reset, counters as growth since the last mark
        stats = torch.cuda.memory_stats(dev)
        row = {c: stats[c] for c in COLUMNS}
        for c in COLUMNS:
            if c.endswith((".allocated", ".freed")):
                row[c] = stats[c] - last.get(c, 0)
                last[c] = stats[c]
        seen.append(row)
        torch.cuda.reset_peak_memory_stats(dev)

    mark()
    seen.clear()
    a = torch.empty(3 * MiB, dtype=torch.uint8, device=dev)
    mark()
    b = torch.empty(700, 1024, device=dev)
    mark()
    c = a.float()
    mark()
    del a
    mark()
    d = (b @ b.T).sum()
    mark()
    e = torch.empty(10, device=dev)
    mark()
    return seen, (c, d, e)


def fresh(dev):
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()


def profile_and_compare(dev):
    torch.empty(1, device=dev)  # CUDA and cuBLAS up before both runs
    (torch.ones(8, 8, device=dev) @ torch.ones(8, 8, device=dev)).sum()
    for _ in range(2):  # the first run warms up whatever torch caches on first use
        fresh(dev)
        expected, kept = reference(dev)
        del kept
    fresh(dev)
    with LineProfiler(work, target_gpu=dev.index) as lp:
        reader = lp.stats_reader
        kept = work(dev)
    assert lp.device == f"cuda:{dev.index}"
    records = [r for r in lp.display(work, COLUMNS).records() if r["hits"]]
    body = [r for r in records if r["line"] > work.__code__.co_firstlineno][:-1]  # not `return`
    assert body[0]["code"].strip().startswith("a = torch.empty(3 * MiB")
    got = [{c: r[c] for c in COLUMNS} for r in body]
    assert got == expected, "\n".join(f"{g}\n{w}\n" for g, w in zip(got, expected))
    del kept
    return reader


def test_lines_match_torch_statistics():
    reader = profile_and_compare(torch.device("cuda:0"))
    # The allocator's fields were located and used (not the slower binding).
    assert reader == "allocator memory", _core._cuda_direct_why_not(0)


def test_lines_match_torch_statistics_through_the_binding(script):
    out = script(
        f"""
        import os, sys
        os.environ["MEMLAB_RS_CUDA_STATS"] = "binding"
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        import torch
        from test_line_profiler_cuda import profile_and_compare
        print(profile_and_compare(torch.device("cuda:0")))
        """
    )
    assert out.strip() == "torch._C._cuda_memoryStats"


def test_cuda_initialised_inside_the_profiled_function(script):
    out = script(
        """
        import torch
        from memlab_rs import LineProfiler

        def first_use():
            x = torch.empty(256, 1024, device="cuda")
            y = torch.empty(512, 1024, device="cuda")
            return x, y

        assert not torch.cuda.is_initialized()
        with LineProfiler(first_use) as lp:
            kept = first_use()
        for r in lp.display(columns=("allocated_bytes.all.allocated",)).records():
            print(r["code"].strip(), r["allocated_bytes.all.allocated"])
        """
    )
    assert 'y = torch.empty(512, 1024, device="cuda") 2097152' in out
    assert 'x = torch.empty(256, 1024, device="cuda") 1048576' in out


def test_peak_memory_stats_keep_the_true_peak():
    dev = torch.device("cuda:0")

    def spike():
        big = torch.empty(64 * MiB, dtype=torch.uint8, device=dev)
        del big
        small = torch.empty(MiB, dtype=torch.uint8, device=dev)
        return small

    base = torch.cuda.memory_allocated(dev)
    with LineProfiler(spike) as lp:
        kept = spike()
    assert lp.peak_memory_stats()["allocated_bytes.all.peak"] >= base + 64 * MiB
    del kept


def test_importing_does_not_initialise_cuda(script):
    out = script("import torch, memlab_rs; print(torch.cuda.is_initialized())")
    assert out.strip() == "False"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (nvidia-h200-x2)")
def test_set_target_gpu_switches_inside_a_profiled_function(script):
    out = script(
        """
        import torch
        from memlab_rs import profile, set_target_gpu, global_line_profiler

        @profile
        def two_devices():
            a = torch.empty(256, 1024, device="cuda:0")
            set_target_gpu(1)
            b = torch.empty(512, 1024, device="cuda:1")
            c = torch.empty(1024, 1024, device="cuda:0")
            return a, b, c

        set_target_gpu(torch.device("cuda:0"))
        kept = two_devices()
        lp = global_line_profiler()
        for r in lp.display(columns=("allocated_bytes.all.allocated",)).records():
            print(repr(r["code"].strip()), r["allocated_bytes.all.allocated"])
        """
    )
    lines = dict(line.rsplit(" ", 1) for line in out.splitlines() if line.startswith("'"))
    assert lines["'a = torch.empty(256, 1024, device=\"cuda:0\")'"] == str(MiB)
    assert lines["'b = torch.empty(512, 1024, device=\"cuda:1\")'"] == str(2 * MiB)
    assert lines["'c = torch.empty(1024, 1024, device=\"cuda:0\")'"] == "0"  # not GPU 1
