"""Allocation-history analysis: memlab_rs.trace against torch's own ``_memory_viz`` text
analyses on the same snapshot, side by side in one run; getting the snapshot out of torch;
a ~1 GB snapshot's memory.

GPU mode (the default; needs CUDA, else it says so and exits 0):
  (a) GPT-2 1x64 (AdamW) training steps under torch's history (``"all"``, context
      ``"alloc"``, Python stacks) until it holds >= --entries entries, dumped with
      ``torch.cuda.memory._dump_snapshot`` to a temporary file. On that file: the pickle load
      (timed apart), then from the loaded dict ``memlab_rs.trace.load(data)`` (records +
      analysis) plus ``.text()`` (the peak table), against ``_memory_viz.trace(data)`` and
      ``_memory_viz.segsum(data)``. Targets: ours <= 0.1 s from the loaded dict to the finished
      report, and >= 10x faster than torch's.
  (b) Getting the snapshot out of torch, each in a fresh process holding the same kind of
      history: ``memlab_rs._sources.cuda_history.snapshot()`` (no inductor import) against a first
      ``torch.cuda.memory._snapshot()`` (which imports ``torch._inductor``), each followed by
      a second (warm) call; what remains is what ours still costs.
  (c) Memory: a snapshot of about --big-gb GB, built from (a)'s entries repeated with shifted
      addresses and times (and the end layout's segments repeated alike), on /tmp; a fresh
      process loads it and makes the report, printing the time and peak RSS of each stage
      against the file's size (killed after --big-timeout seconds; that is said plainly):
      once streamed (``trace.load(path)``), once through ``pickle.load`` and the dict.

CPU mode (``--cpu``; runs anywhere): a synthetic snapshot in torch's schema, made by a small
model of the caching allocator (best fit, block splitting and merging, 2 MiB / 20 MiB
segments) running GPT-2-shaped training steps: --entries entries, shared frame dicts, stacks
about 30 deep (the backward's allocations have none, as on the autograd thread), free entries
sharing their allocation's frame list. Then the same comparison as (a), through a pickle file;
``--big-gb`` runs (c) on it too.

Timings are medians of --rounds rounds, the variants taking turns (torch's ``trace``, the
slowest, runs at most 3 times).

    python bench/trace_analysis.py [--cpu] [--entries 120000] [--rounds 7] [--big-gb 1.0]
                                   [--big-timeout 120] [--quick]
"""

from __future__ import annotations

import argparse
import bisect
import importlib
import json
import math
import os
import pickle
import platform
import random
import resource
import selectors
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch
from torch.cuda import _memory_viz

import memlab_rs
from memlab_rs import trace as mtrace

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_ENTRIES = 2_000_000
GB = 1e9
MB = 1e6


def rss_peak() -> int:
    """This process's peak resident set size, bytes: VmHWM where there is /proc (ru_maxrss
    keeps the parent's peak across exec, which would hide a worker's smaller one)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def describe(data: dict) -> str:
    entries = [e for d in data["device_traces"] for e in d]
    frames = {id(f) for e in entries for f in e.get("frames", ())}
    depths = [len(e.get("frames", ())) for e in entries if e["action"] == "alloc"]
    with_stack = [d for d in depths if d]
    allocs = len(depths)
    return (f"{len(entries):,} entries ({allocs:,} allocations, "
            f"{allocs - len(with_stack):,} without a Python stack), "
            f"{len(data['segments'])} segments at the end, {len(frames):,} distinct frames, "
            f"stack depth median {statistics.median(with_stack or [0]):.0f} "
            f"max {max(with_stack or [0])}")


# -- the side-by-side comparison -------------------------------------------------------------


def ours(data: dict) -> tuple[float, float, str, mtrace.TraceResult]:
    start = time.perf_counter()
    result = mtrace.load(data)
    analysed = time.perf_counter()
    text = result.text()
    done = time.perf_counter()
    return analysed - start, done - analysed, text, result


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def compare(path: str, rounds: int, start: dict | None = None) -> None:
    """The pickle load, then ours and torch's text analyses of the loaded dict. With `start`
    (the layout our Tracer keeps when recording begins), ours also analyses the dict as the
    Tracer would have saved it."""
    size = os.path.getsize(path)
    loads = []
    for _ in range(3):
        began = time.perf_counter()
        with open(path, "rb") as f:
            data = pickle.load(f)
        loads.append(time.perf_counter() - began)
    entries = sum(len(d) for d in data["device_traces"])
    print(f"  file {size / MB:.1f} MB, {size / max(entries, 1):.0f} bytes per entry")
    recorded = None
    if start is not None:
        recorded = dict(data, memlab_rs={"version": 1, "source": "cuda", "start": start})

    samples: dict[str, list[float]] = {
        "analyse": [], "render": [], "ours": [], "recorded": [], "trace": [], "segsum": []}
    text = ""
    result = None
    order = ["ours", "recorded", "trace", "segsum"]
    for r in range(rounds):
        for name in order[r % 4 :] + order[: r % 4]:
            if name == "ours":
                a, b, text, result = ours(data)
                samples["analyse"].append(a)
                samples["render"].append(b)
                samples["ours"].append(a + b)
            elif name == "recorded" and recorded is not None:
                a, b, _, _ = ours(recorded)
                samples["recorded"].append(a + b)
            elif name == "trace" and len(samples["trace"]) < 3:
                samples["trace"].append(timed(_memory_viz.trace, data))
            elif name == "segsum":
                samples["segsum"].append(timed(_memory_viz.segsum, data))
    streamed = []
    for _ in range(3):
        began = time.perf_counter()
        mtrace.load(path).text()
        streamed.append(time.perf_counter() - began)

    m = statistics.median
    ours_s = m(samples["ours"])
    print(f"  {'pickle.load(file)':<46} {m(loads):8.3f} s   (median of 3; not in the "
          "figures below, which start from the loaded dict)")
    print(f"  {'memlab_rs: trace.load(dict)':<46} {m(samples['analyse']):8.3f} s   "
          "(dict -> records, block sizes, peak, rows)")
    print(f"  {'memlab_rs: .text()':<46} {m(samples['render']):8.3f} s")
    print(f"  {'memlab_rs: load(dict) + text()':<46} {ours_s:8.3f} s   target <= 0.1 s: "
          f"{'met' if ours_s <= 0.1 else 'NOT met'}")
    if samples["recorded"]:
        mine = m(samples["recorded"])
        print(f"  {'  the same with the Tracer start layout':<46} {mine:8.3f} s   target <= "
              f"0.1 s: {'met' if mine <= 0.1 else 'NOT met'} (block sizes replayed exactly)")
    for name, values in (("torch _memory_viz.trace(data)", samples["trace"]),
                         ("torch _memory_viz.segsum(data)", samples["segsum"])):
        speedup = m(values) / ours_s
        print(f"  {name:<46} {m(values):8.3f} s   memlab_rs {speedup:7.1f}x faster   "
              f"target >= 10x: {'met' if speedup >= 10 else 'NOT met'}")
    print("  (segsum draws the end layout only, not the history; trace walks every entry)")
    through_dict = m(loads) + ours_s
    print(f"  {'memlab_rs: trace.load(path) + text()':<46} {m(streamed):8.3f} s   "
          f"(the file streamed into records, median of 3) against pickle.load + "
          f"load(dict) + text() {through_dict:.3f} s: "
          f"{'not slower' if m(streamed) <= through_dict else 'SLOWER'}")
    print(f"  medians of {len(samples['ours'])} rounds (torch trace: {len(samples['trace'])})")
    assert result is not None
    device = result.devices[0] if result.devices else None
    if device is not None:
        s = result.summary(device)
        print(f"  report: {device} Max mem {s['max_mem']:,} B, events {s['events']:,}, "
              f"{len(result.rows(device))} rows, {s['live_at_peak']:,} allocations alive at "
              "the peak; notices:")
        for notice in result.notices(device):
            print(f"    - {notice}")
    print("  first lines of the report:")
    for line in text.splitlines()[:8]:
        print(f"    {line}")


# -- (c) a large snapshot --------------------------------------------------------------------


def address_span(data: dict) -> tuple[int, int]:
    lo, hi = 1 << 64, 0
    for seg in data["segments"]:
        lo, hi = min(lo, seg["address"]), max(hi, seg["address"] + seg["total_size"])
    for d in data["device_traces"]:
        for e in d:
            if "addr" in e and e["action"] not in ("snapshot", "oom"):
                lo, hi = min(lo, e["addr"]), max(hi, e["addr"] + e.get("size", 0))
    return lo, hi


def build_big(source: str, target: str, gigabytes: float) -> None:
    """Repeat `source`'s history with shifted addresses and times until the pickle reaches
    about `gigabytes`: each copy is the same run on its own address range, after the previous
    one; the end layout holds every copy's segments. Frame dicts stay shared (a long run
    repeats the same lines); each copy gets its own frame lists (as torch gives each
    allocation one), its free entries sharing their allocation's."""
    start = time.perf_counter()
    size = os.path.getsize(source)
    with open(source, "rb") as f:
        data = pickle.load(f)
    copies = max(1, math.ceil(gigabytes * GB / size))
    lo, hi = address_span(data)
    stride = (hi - lo + (2 << 20) + (1 << 30)) // (2 << 20) * (2 << 20)
    trace0 = data["device_traces"][0]
    times = [e["time_us"] for e in trace0]
    period = max(times) - min(times) + 1000

    def shifted(item: dict, k: int, lists: dict, key: str) -> dict:
        out = dict(item)
        if key in out and out.get("action") not in ("snapshot", "oom"):
            out[key] += k * stride
        if "time_us" in out:
            out["time_us"] += k * period
        frames = out.get("frames")
        if frames is not None:
            mine = lists.get(id(frames))
            if mine is None:
                mine = lists[id(frames)] = list(frames)
            out["frames"] = mine
        return out

    entries, segments = [], []
    for k in range(copies):
        lists: dict[int, list] = {}
        entries.extend(shifted(e, k, lists, "addr") for e in trace0)
        for seg in data["segments"]:
            copy = shifted(seg, k, lists, "address")
            copy["blocks"] = [shifted(b, k, lists, "address") for b in seg["blocks"]]
            segments.append(copy)
    big = dict(data, segments=segments, device_traces=[entries])
    with open(target, "wb") as f:
        pickle.dump(big, f, protocol=4)
    print(json.dumps({"copies": copies, "entries": len(entries), "segments": len(segments),
                      "bytes": os.path.getsize(target),
                      "seconds": time.perf_counter() - start, "rss": rss_peak()}), flush=True)


def load_report(path: str, streamed: bool = False) -> None:
    """Load `path` and make the report, printing time and peak RSS after each stage:
    through pickle.load and the dict, or `streamed` (trace.load(path) reads the file into
    records without the dict)."""
    def stage(name: str, began: float) -> float:
        now = time.perf_counter()
        print(json.dumps({"stage": name, "seconds": now - began, "rss": rss_peak()}),
              flush=True)
        return now

    t = stage("imported", time.perf_counter())
    if streamed:
        result = mtrace.load(path)
        t = stage("trace.load(path)", t)
    else:
        with open(path, "rb") as f:
            data = pickle.load(f)
        t = stage("pickle.load", t)
        result = mtrace.load(data)
        t = stage("trace.load(dict)", t)
    text = result.text()
    t = stage("text()", t)
    result.timeline()
    t = stage("timeline()", t)
    print(json.dumps({"max_mem": result.max_mem(), "rows": len(result.rows()),
                      "lines": len(text.splitlines())}), flush=True)


def vm_hwm(pid: int) -> int:
    """A live process's peak resident set size, bytes (0 when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def worker(args: list[str], timeout: float) -> tuple[list[dict], int, str | None]:
    """Run this script as a worker; its JSON lines, its peak RSS as seen from here, and why
    it failed (None when it did not)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", *args]
    errors = tempfile.TemporaryFile("w+")  # not a pipe: a chatty child cannot block on it
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True)
    lines: list[dict] = []
    hwm = 0
    began = time.perf_counter()
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ)
    failure = None
    while True:
        hwm = max(hwm, vm_hwm(proc.pid))
        if time.perf_counter() - began > timeout:
            proc.kill()
            failure = f"killed after {timeout:.0f} s"
            break
        if sel.select(timeout=0.2):
            line = proc.stdout.readline()
            if not line:
                break
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    proc.wait()
    errors.seek(0)
    err = errors.read()
    errors.close()
    if failure is None and proc.returncode != 0:
        failure = f"exit status {proc.returncode}: {err.strip().splitlines()[-3:]}"
    return lines, hwm, failure


def big_snapshot(source: str, workdir: str, gigabytes: float, timeout: float) -> None:
    target = os.path.join(workdir, "big.pickle")
    lines, hwm, failure = worker(["big-build", source, target, str(gigabytes)], 600)
    if failure or not lines:
        print(f"  building the large snapshot failed: {failure}")
        return
    b = lines[-1]
    print(f"  built {b['bytes'] / GB:.2f} GB ({b['copies']} copies of the trace: "
          f"{b['entries']:,} entries, {b['segments']:,} segments) in {b['seconds']:.0f} s "
          f"(the builder's peak RSS {b['rss'] / GB:.1f} GB)")
    for kind, how in (("stream-report", "trace.load(path) (streamed)"),
                      ("load-report", "pickle.load, trace.load(dict)")):
        report_in_worker(kind, how, target, b["bytes"], timeout)
    os.remove(target)


def report_in_worker(kind: str, how: str, target: str, size: int, timeout: float) -> None:
    lines, hwm, failure = worker([kind, target], timeout)
    print(f"  a fresh process: {how}, text(), timeline(); peak RSS "
          f"after each stage (file {size / GB:.2f} GB):")
    base = lines[0]["rss"] if lines and "stage" in lines[0] else 0
    for line in lines:
        if "stage" in line:
            added = line["rss"] - base
            print(f"    {line['stage']:<18} {line['seconds']:8.2f} s   peak RSS "
                  f"{line['rss'] / GB:6.2f} GB, {added / GB:6.2f} GB more than after the "
                  f"imports = {added / size:5.1f}x the file")
    done = [x for x in lines if "max_mem" in x]
    if done:
        print(f"    report made: Max mem {done[0]['max_mem']:,} B, {done[0]['rows']} rows")
    if failure:
        stages = [x["stage"] for x in lines if "stage" in x]
        print(f"    DID NOT FINISH: {failure}, after stage {stages[-1] if stages else 'none'}")
    print(f"    peak RSS seen from outside (VmHWM): {hwm / GB:.2f} GB = {hwm / size:.1f}x "
          "the file")


# -- GPU mode ----------------------------------------------------------------------------------


def record_gpt2(entries: int):
    """GPT-2 1x64 steps under torch's history until it holds >= `entries` entries (each
    allocation makes about three: alloc, free_requested, free_completed). Leaves the
    history on; returns the number of steps and the start layout our Tracer would keep."""
    sys.path.insert(0, HERE)
    from trace_workloads import gpt2

    from memlab_rs._sources import cuda_history as _cuda_history

    step, _model = gpt2(1, 64)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(
        "all", context="alloc", stacks="python", max_entries=MAX_ENTRIES
    )
    start = _cuda_history.start_layout()
    first = torch.cuda.memory_stats()["allocation.all.allocated"]
    steps = 0
    while 3 * (torch.cuda.memory_stats()["allocation.all.allocated"] - first) < entries * 1.02:
        step()
        steps += 1
    torch.cuda.synchronize()
    return steps, start


def snapshot_worker(how: str, entries: int) -> None:
    """In a fresh process: the history of `entries`, then a first and a second snapshot."""
    from memlab_rs._sources import cuda_history as _cuda_history

    steps, _ = record_gpt2(entries)
    take = _cuda_history.snapshot if how == "ours" else torch.cuda.memory._snapshot
    inductor_before = "torch._inductor" in sys.modules
    start = time.perf_counter()
    snap = take()
    first = time.perf_counter() - start
    inductor_after = "torch._inductor" in sys.modules
    start = time.perf_counter()
    take()
    second = time.perf_counter() - start
    start = time.perf_counter()
    importlib.import_module("torch._inductor")  # what torch's first call pays for
    inductor_import = time.perf_counter() - start
    print(json.dumps({"how": how, "entries": sum(len(d) for d in snap["device_traces"]),
                      "first": first, "second": second, "steps": steps,
                      "inductor_before": inductor_before, "inductor_after": inductor_after,
                      "inductor_import": inductor_import}), flush=True)


def gpu_mode(args) -> None:
    if not torch.cuda.is_available():
        print("This benchmark needs a CUDA GPU (or run it with --cpu); skipped")
        return
    print(f"{torch.cuda.get_device_name(0)}")
    workdir = tempfile.mkdtemp(prefix="memlab_trace_", dir="/tmp")
    try:
        path = os.path.join(workdir, "gpt2_1x64.pickle")
        steps, start_layout = record_gpt2(args.entries)
        start = time.perf_counter()
        torch.cuda.memory._dump_snapshot(path)
        dumped = time.perf_counter() - start
        torch.cuda.memory._record_memory_history(None)
        with open(path, "rb") as f:
            data = pickle.load(f)
        print(f"\n(a) GPT-2 1x64 AdamW, {steps} steps under torch's history: {describe(data)}")
        print(f"  torch.cuda.memory._dump_snapshot took {dumped:.2f} s here (its first "
              f"_snapshot imports inductor: see (b))")
        del data
        compare(path, args.rounds, start_layout)

        print("\n(b) getting the snapshot out of torch, each in a fresh process with the same "
              "history (GPT-2 1x64 steps):")
        results: dict[str, list[dict]] = {"ours": [], "torch": []}
        for _ in range(args.repeats):
            for how in ("ours", "torch"):
                lines, _, failure = worker(["snapshot", how, str(args.entries)], 300)
                if failure or not lines:
                    print(f"  the {how} worker failed: {failure}")
                    continue
                results[how].append(lines[-1])
        for how, label in (("ours", "memlab_rs._sources.cuda_history.snapshot()"),
                           ("torch", "torch.cuda.memory._snapshot()")):
            got = results[how]
            if not got:
                continue
            m = statistics.median
            print(f"  {label:<38} first call {m(g['first'] for g in got):6.3f} s, "
                  f"second {m(g['second'] for g in got):6.3f} s; inductor imported by it: "
                  f"{any(g['inductor_after'] and not g['inductor_before'] for g in got)}, "
                  f"already before: {any(g['inductor_before'] for g in got)} "
                  f"({got[0]['entries']:,} entries, {len(got)} process(es))")
        if results["ours"]:
            g = results["ours"]
            m = statistics.median
            print(f"  what remains in ours: {m(x['first'] for x in g):.3f} s on the first "
                  f"call, {m(x['second'] for x in g):.3f} s warm (torch's C++ snapshot and "
                  f"frame symbolising); importing torch._inductor, which we skip, took "
                  f"{m(x['inductor_import'] for x in g):.2f} s afterwards")

        if args.big_gb > 0:
            print(f"\n(c) a ~{args.big_gb:g} GB snapshot built from (a)'s trace:")
            big_snapshot(path, workdir, args.big_gb, args.big_timeout)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# -- CPU mode: a synthetic snapshot ----------------------------------------------------------

SITE = "/opt/venv/lib/python3.12/site-packages"
MODULE = f"{SITE}/torch/nn/modules/module.py"
GPT2 = f"{SITE}/transformers/models/gpt2/modeling_gpt2.py"
MIN_BLOCK, SMALL_SIZE, SMALL_SEGMENT = 512, 1 << 20, 2 << 20
LARGE_SEGMENT, MIN_LARGE_ALLOC, ROUND_LARGE = 20 << 20, 10 << 20, 2 << 20


class Block:
    __slots__ = ("addr", "size", "small", "allocated", "requested", "frames", "prev", "next")

    def __init__(self, addr: int, size: int, small: bool):
        self.addr, self.size, self.small = addr, size, small
        self.allocated, self.requested, self.frames = False, 0, []
        self.prev: Block | None = None  # neighbours within the segment
        self.next: Block | None = None


class Allocator:
    """Enough of torch's caching allocator for a consistent history: sizes rounded to 512
    bytes; a small pool (<= 1 MiB, 2 MiB segments) and a large one (20 MiB segments below
    10 MiB, else rounded to 2 MiB); best fit by (size, address); a block splits when what is
    left is >= 512 bytes (small) or > 1 MiB (large); a freed block merges with its free
    neighbours in the segment."""

    def __init__(self, record):
        self.by_addr: dict[int, Block] = {}  # blocks handed out
        self.free: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        self.free_blocks: dict[int, Block] = {}
        self.segments: dict[int, Block] = {}  # segment address -> its first block
        self.sizes: dict[int, tuple[int, bool]] = {}
        self.next_address = 0x7F00_0000_0000
        self.allocated = 0
        self.peak = 0
        self.record = record  # called with (action, addr, size, frames)

    def _add_free(self, block: Block) -> None:
        bisect.insort(self.free[block.small], (block.size, block.addr))
        self.free_blocks[block.addr] = block

    def _take_free(self, block: Block) -> None:
        pool = self.free[block.small]
        del pool[bisect.bisect_left(pool, (block.size, block.addr))]
        del self.free_blocks[block.addr]

    def malloc(self, requested: int, frames: list) -> int:
        size = max(MIN_BLOCK, -(-requested // MIN_BLOCK) * MIN_BLOCK)
        small = size <= SMALL_SIZE
        pool = self.free[small]
        i = bisect.bisect_left(pool, (size, 0))
        if i < len(pool):
            block = self.free_blocks[pool[i][1]]
            self._take_free(block)
        else:
            if small:
                total = SMALL_SEGMENT
            elif size < MIN_LARGE_ALLOC:
                total = LARGE_SEGMENT
            else:
                total = -(-size // ROUND_LARGE) * ROUND_LARGE
            block = Block(self.next_address, total, small)
            self.next_address += total + (2 << 20)  # segments never touch
            self.segments[block.addr] = block
            self.sizes[block.addr] = (total, small)
            self.record("segment_alloc", block.addr, total, [])
        remaining = block.size - size
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:
            rest = Block(block.addr + size, remaining, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._add_free(rest)
        block.allocated, block.requested, block.frames = True, requested, frames
        self.by_addr[block.addr] = block
        self.allocated += block.size
        self.peak = max(self.peak, self.allocated)
        self.record("alloc", block.addr, requested, frames)
        return block.addr

    def release(self, addr: int) -> None:
        block = self.by_addr.pop(addr)
        self.record("free_requested", addr, block.requested, block.frames)
        self.record("free_completed", addr, block.requested, block.frames)
        self.allocated -= block.size
        block.allocated, block.frames = False, []
        prev = block.prev
        if prev is not None and not prev.allocated:
            self._take_free(prev)
            prev.size += block.size
            prev.next = block.next
            if block.next is not None:
                block.next.prev = prev
            block = prev
        nxt = block.next
        if nxt is not None and not nxt.allocated:
            self._take_free(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
        self._add_free(block)

    def layout(self) -> list[dict]:
        """The end layout, as ``_snapshot()["segments"]``."""
        out = []
        for seg_addr, first in sorted(self.segments.items()):
            total, small = self.sizes[seg_addr]
            blocks, allocated, requested = [], 0, 0
            block: Block | None = first
            while block is not None:
                want = block.requested if block.allocated else block.size
                blocks.append({"address": block.addr, "size": block.size,
                               "requested_size": want,
                               "state": "active_allocated" if block.allocated else "inactive",
                               "frames": block.frames})
                if block.allocated:
                    allocated += block.size
                    requested += want
                block = block.next
            out.append({"device": 0, "address": seg_addr, "total_size": total,
                        "allocated_size": allocated, "active_size": allocated,
                        "requested_size": requested, "stream": 0,
                        "segment_type": "small" if small else "large",
                        "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                        "blocks": blocks})
        return out


class Enough(Exception):
    """The synthetic history holds the entries asked for."""


def synthetic_snapshot(target: int, seed: int = 0) -> tuple[dict, dict]:
    """A snapshot in torch's schema of GPT-2 (124M) 1x64 AdamW steps on the model allocator:
    the parameters and optimizer state exist before recording (one step runs unrecorded
    first), then steps are recorded until `target` entries. Also returns the allocator's
    figures over the recorded region (the analysis must find the same ``max_mem``)."""
    rng = random.Random(seed)
    frames_by_key: dict[tuple, dict] = {}

    def frame(filename: str, line: int, name: str) -> dict:
        key = (filename, line, name)
        got = frames_by_key.get(key)
        if got is None:
            got = frames_by_key[key] = {"filename": filename, "line": line, "name": name}
        return got

    entries: list[dict] = []
    state = {"recording": False, "time": 1_795_000_000_000_000, "tag": ""}

    def record(action: str, addr: int, size: int, frames: list) -> None:
        if state["recording"]:
            state["time"] += rng.randint(1, 40)
            entries.append({"action": action, "addr": addr, "size": size, "stream": 0,
                            "time_us": state["time"], "frames": frames,
                            "compile_context": "N/A", "user_metadata": state["tag"]})

    heap = Allocator(record)

    def alloc(size: int, stack: list | None) -> int:
        addr = heap.malloc(size, list(stack) if stack else [])
        if state["recording"] and len(entries) >= target:
            raise Enough
        return addr

    def free(addr: int) -> None:
        heap.release(addr)
        if state["recording"] and len(entries) >= target:
            raise Enough

    def call() -> list[dict]:
        return [frame(MODULE, 1790, "_call_impl"), frame(MODULE, 1779, "_wrapped_call_impl")]

    train, runpy = "/home/user/project/train.py", "/usr/lib/python3.12/runpy.py"
    outer = [frame(train, 41, "train_step"), frame(train, 63, "run"), frame(train, 88, "main"),
             frame(train, 97, "<module>"), frame(runpy, 88, "_run_code"),
             frame(runpy, 198, "_run_module_as_main")]
    generic, capture = f"{SITE}/transformers/utils/generic.py", \
        f"{SITE}/transformers/utils/output_capturing.py"
    model_frames = ([frame(GPT2, 922, "forward"), frame(capture, 286, "wrapper"),
                     frame(generic, 1068, "wrapper")] + call()
                    + [frame(GPT2, 1291, "forward"), frame(generic, 939, "wrapper")] + call()
                    + outer)
    block_frames = (call() + [frame(f"{SITE}/transformers/modeling_layers.py", 109, "__call__")]
                    + model_frames)
    functional = f"{SITE}/torch/nn/functional.py"
    leaves = {
        "ln": [frame(functional, 2901, "layer_norm"),
               frame(f"{SITE}/torch/nn/modules/normalization.py", 217, "forward")] + call(),
        "conv1d": [frame(f"{SITE}/transformers/pytorch_utils.py", 117, "forward")] + call(),
        "dropout": [frame(functional, 1443, "dropout"),
                    frame(f"{SITE}/torch/nn/modules/dropout.py", 73, "forward")] + call(),
        "softmax": [frame(functional, 2140, "softmax")],
        "gelu": [frame(f"{SITE}/transformers/activations.py", 56, "forward")] + call(),
        "embedding": [frame(functional, 2542, "embedding"),
                      frame(f"{SITE}/torch/nn/modules/sparse.py", 190, "forward")] + call(),
        "none": [],
    }

    def site(part: str, line: int, leaf: str) -> list[dict]:
        """The stack of an op on `line` of the block (part "block") or of its attention or
        MLP (innermost first)."""
        if part == "block":
            return leaves[leaf] + [frame(GPT2, line, "forward")] + block_frames
        sub = frame(GPT2, line, "forward")
        block_line = 570 if part == "attn" else 590
        return leaves[leaf] + [sub] + call() + [frame(GPT2, block_line, "forward")] + block_frames

    dim, tokens, heads, vocab, layers = 768, 64, 12, 50257, 12
    act, qkv, mlp = tokens * dim * 4, tokens * 3 * dim * 4, tokens * 4 * dim * 4
    scores, mask, stat = heads * tokens * tokens * 4, tokens * dim, tokens * 4
    # (part, line, leaf, sizes kept for the backward, temporaries freed at once)
    layer_ops = [
        ("block", 567, "ln", [act, stat, stat], []),
        ("attn", 311, "conv1d", [qkv], []),
        ("attn", 230, "none", [scores], [512]),
        ("attn", 236, "softmax", [scores], []),
        ("attn", 243, "dropout", [mask, scores], []),
        ("attn", 246, "none", [act], []),
        ("attn", 330, "none", [act], []),
        ("attn", 331, "conv1d", [act], []),
        ("attn", 332, "dropout", [mask, act], []),
        ("block", 575, "none", [act], []),
        ("block", 586, "ln", [act, stat, stat], []),
        ("mlp", 283, "conv1d", [mlp], []),
        ("mlp", 284, "gelu", [mlp], [mlp, mlp, mlp]),
        ("mlp", 285, "conv1d", [act], []),
        ("mlp", 286, "dropout", [mask, act], []),
        ("block", 592, "none", [act], []),
    ]
    layer_params = [3072, 3072, 3 * dim * dim * 4, 3 * dim * 4, dim * dim * 4, dim * 4,
                    3072, 3072, 4 * dim * dim * 4, 4 * dim * 4, 4 * dim * dim * 4, dim * 4]
    params = [vocab * dim * 4, 1024 * dim * 4] + layer_params * layers + [3072, 3072]
    adamw = f"{SITE}/torch/optim/adamw.py"
    optimizer = f"{SITE}/torch/optim/optimizer.py"
    opt_frames = [frame(adamw, 561, "_multi_tensor_adamw"), frame(adamw, 781, "adamw"),
                  frame(adamw, 231, "step"), frame(optimizer, 79, "_use_grad"),
                  frame(optimizer, 516, "wrapper"), frame(train, 43, "train_step")] + outer[1:]
    opt_scalar = [frame(adamw, 548, "_multi_tensor_adamw")] + opt_frames[1:]

    for size in params:  # parameters, then AdamW's exp_avg and exp_avg_sq
        heap.malloc(size, [])
    for size in params * 2:
        heap.malloc(size, [])

    def step() -> None:
        state["tag"] = "forward:"
        saved: list[list[int]] = []
        emb = leaves["embedding"] + [frame(GPT2, 870, "forward")] + model_frames[1:]
        saved.append([alloc(act, emb), alloc(act, emb), alloc(act, emb)])
        for layer in range(layers):
            kept = []
            for part, line, leaf, keep, temps in layer_ops:
                state["tag"] = f"forward:transformer.h.{layer}.{part}".replace(".block", "")
                stack = site(part, line, leaf)
                kept += [alloc(size, stack) for size in keep]
                for addr in [alloc(size, stack) for size in temps]:
                    free(addr)
            saved.append(kept)
        state["tag"] = "forward:lm_head"
        logits_stack = [frame(GPT2, 1310, "forward")] + model_frames[6:]  # in the LM head
        logits = alloc(tokens * vocab * 4, logits_stack)
        shifted = alloc(tokens * vocab * 4, logits_stack)
        logp = alloc(tokens * vocab * 4, [frame(functional, 3494, "cross_entropy")]
                     + logits_stack)
        free(shifted)
        loss = alloc(512, logits_stack)
        state["tag"] = "backward:"
        grad = alloc(tokens * vocab * 4, None)
        grads = [alloc(params[0], None)]
        free(logp)
        free(logits)
        free(grad)
        for layer in reversed(range(layers)):
            state["tag"] = f"backward:transformer.h.{layer}"
            kept = saved.pop()
            grad = alloc(act, None)
            for addr in reversed(kept):
                temp = alloc(rng.choice((act, mlp, scores)), None)
                free(addr)
                free(temp)
            grads += [alloc(size, None) for size in layer_params]
            free(grad)
        for addr in saved.pop():
            free(addr)
        grads += [alloc(size, None) for size in params[1:2] + params[-2:]]
        free(loss)
        state["tag"] = "optimizer:"
        scalars = [alloc(512, opt_scalar) for _ in range(4)]
        sqrt = [alloc(size, opt_frames) for size in params]
        for addr in sqrt + scalars:
            free(addr)
        for addr in grads:  # zero_grad(set_to_none=True)
            free(addr)

    step()  # unrecorded: the allocator's segments exist before recording, as after warm-up
    start_allocated = heap.allocated
    heap.peak = heap.allocated
    state["recording"] = True
    # What our Tracer keeps when it starts: the layout, taken by a snapshot that leaves a
    # "snapshot" entry in the history (the analysis starts after it).
    start = {"time_us": state["time"], "segments": heap.layout()}
    record("snapshot", 0, start_allocated, [])
    steps = 0
    try:
        while True:
            step()
            steps += 1
    except Enough:
        pass
    snapshot = {
        "segments": heap.layout(),
        "device_traces": [entries],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                               "garbage_collection_threshold": 0.0,
                               "expandable_segments": False,
                               "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)}},
        "external_annotations": [],
    }
    facts = {"max_mem": heap.peak, "start_allocated": start_allocated,
             "end_allocated": heap.allocated, "steps": steps, "start": start}
    return snapshot, facts


def cpu_mode(args) -> None:
    print(f"CPU mode: a synthetic snapshot of GPT-2 1x64 AdamW steps ({platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())})")
    start = time.perf_counter()
    data, facts = synthetic_snapshot(args.entries)
    made = time.perf_counter() - start
    print(f"  made in {made:.1f} s: {facts['steps']} whole steps and part of one; "
          f"{describe(data)}")
    workdir = tempfile.mkdtemp(prefix="memlab_trace_", dir="/tmp")
    try:
        path = os.path.join(workdir, "synthetic.pickle")
        with open(path, "wb") as f:
            pickle.dump(data, f, protocol=4)
        recorded = dict(data, memlab_rs={"version": 1, "source": "cuda",
                                         "start": facts["start"]})
        s = mtrace.load(recorded).summary(0)
        got = (s["max_mem"], s["start_allocated"], s["end_allocated"])
        want = (facts["max_mem"], facts["start_allocated"], facts["end_allocated"])
        print(f"  check, with the start layout: memlab_rs (Max mem, start, end) {got}, the "
              f"model allocator's {want}: {'equal' if got == want else 'DIFFERENT'}")
        del data, recorded
        compare(path, args.rounds, facts["start"])
        if args.big_gb > 0:
            print(f"\n(c) a ~{args.big_gb:g} GB snapshot built from the synthetic trace:")
            big_snapshot(path, workdir, args.big_gb, args.big_timeout)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        kind, rest = sys.argv[2], sys.argv[3:]
        if kind == "big-build":
            build_big(rest[0], rest[1], float(rest[2]))
        elif kind == "load-report":
            load_report(rest[0])
        elif kind == "stream-report":
            load_report(rest[0], streamed=True)
        elif kind == "snapshot":
            snapshot_worker(rest[0], int(rest[1]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="a synthetic snapshot; no GPU")
    parser.add_argument("--entries", type=int, default=120_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=1,
                        help="(b): fresh processes per way of taking the snapshot")
    parser.add_argument("--big-gb", type=float, default=None,
                        help="(c): size of the large snapshot in GB, 0 skips it "
                        "(default 1.0; 0 with --cpu)")
    parser.add_argument("--big-timeout", type=float, default=120,
                        help="(c): seconds the large snapshot's load and report may take")
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds, (c) at 0.25 GB with 60 s")
    args = parser.parse_args()
    if args.big_gb is None:
        args.big_gb = 0.0 if args.cpu else (0.25 if args.quick else 1.0)
    if args.quick:
        args.rounds, args.big_timeout = 3, min(args.big_timeout, 60)
    warnings.simplefilter("ignore")
    began = time.perf_counter()
    print(f"Python {platform.python_version()}, torch {torch.__version__}, "
          f"memlab_rs {memlab_rs.__version__}")
    if args.cpu:
        cpu_mode(args)
    else:
        gpu_mode(args)
    print(f"\n(whole run {time.perf_counter() - began:.0f} s wall)")


if __name__ == "__main__":
    main()
