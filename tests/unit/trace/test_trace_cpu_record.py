"""The CPU trace records CPU allocations and frees with their Python stacks.

``_core._cpu_trace_start(max_entries)`` / ``_cpu_trace_stop()`` through the allocator hook
(``src/sources/cpu/record.rs``, stacks read in Rust by ``py/stack.rs``), checked with real torch
CPU tensors and exact values: sizes, addresses, the file, line and function of each frame,
tags, the ring buffer, shared frame objects, and what real programs do to it in process
(threads, KeyboardInterrupt); fork, collections running finalisers while a stack is read and
interpreter exit are tests/integration/test_trace_processes.py's.

Lines are found by their ``# LINE: name`` markers, so the file can be edited freely.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time
import warnings

import pytest
import torch
import torch.nn.functional as F
from cpu_trace import (  # no_trace_left: an autouse fixture
    alloc_at,
    assert_nothing_installed,
    at,
    entries,
    hook_slots_ours,
    marked_lines,
    no_trace_left,  # noqa: F401
    replay,
)

from memlab_rs import LineProfiler, _core

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the allocator hook rewrites ELF GOT slots (Linux)"
)

MiB = 1 << 20
HERE = os.path.abspath(__file__)
MAX_DEPTH = 128  # py::stack::MAX_DEPTH
LINES = marked_lines(HERE)


def here(marker: str, function: str) -> dict:
    return {"filename": HERE, "line": LINES[marker], "name": function}


# --- one allocation, exactly ---------------------------------------------------------------


def allocate_one_mib():
    return torch.empty(1024, 256)  # LINE: one_mib


def test_a_one_mib_tensor_is_one_alloc_with_its_line_and_its_free_two_entries():
    _core._cpu_trace_start(10_000)
    t = allocate_one_mib()  # LINE: one_mib_call
    address = t.data_ptr()
    del t
    trace = _core._cpu_trace_stop()
    assert at(trace, address) == [
        ("alloc", MiB),
        ("free_requested", MiB),
        ("free_completed", MiB),
    ]
    alloc, requested, completed = [e for e in entries(trace) if e["addr"] == address]
    assert alloc["frames"][0] == here("one_mib", "allocate_one_mib")
    caller = "test_a_one_mib_tensor_is_one_alloc_with_its_line_and_its_free_two_entries"
    assert alloc["frames"][1] == here("one_mib_call", caller)
    assert alloc["stream"] == 0 and alloc["user_metadata"] == ""
    assert requested["time_us"] == completed["time_us"] >= alloc["time_us"]
    assert requested["frames"] == [] and completed["frames"] == []
    assert sorted(alloc) == [
        "action", "addr", "frames", "size", "stream", "time_us", "user_metadata"
    ]  # fmt: skip
    ours = trace["memlab_rs"]
    assert ours["version"] == 1 and ours["source"] == "cpu"
    assert ours["dropped"] == 0 and ours["no_stack"] == 0
    assert trace["allocator_settings"] == {} and trace["external_annotations"] == []
    assert replay(trace) == {s["address"]: s["total_size"] for s in trace["segments"]}
    assert_nothing_installed()


def test_time_us_is_microseconds_since_the_epoch():
    import time

    before = int(time.time() * 1e6)
    _core._cpu_trace_start(100)
    t = torch.empty(MiB, dtype=torch.uint8)
    trace = _core._cpu_trace_stop()
    after = int(time.time() * 1e6)
    start = trace["memlab_rs"]["start"]["time_us"]
    stamp = alloc_at(trace, t.data_ptr())["time_us"]
    assert before - 2000 <= start <= stamp <= after + 2000


# --- what was alive at the start, and what is alive at the stop ---------------------------


def keep_one():
    return torch.empty(3 * 4096 + 8, dtype=torch.uint8)  # LINE: kept


def test_allocations_alive_at_the_start_are_in_start_live_and_in_segments_without_frames():
    before = torch.empty(5 * 4096 + 16, dtype=torch.uint8)
    _core._cpu_trace_start(1000)
    during = keep_one()
    trace = _core._cpu_trace_stop()
    live = trace["memlab_rs"]["start"]["live"]
    assert [before.data_ptr(), 5 * 4096 + 16] in live
    assert live == sorted(live)
    assert [during.data_ptr(), 3 * 4096 + 8] not in live
    segments = {s["address"]: s for s in trace["segments"]}
    assert list(segments) == sorted(segments)
    old = segments[before.data_ptr()]
    assert old == {
        "device": 0,
        "address": before.data_ptr(),
        "total_size": 5 * 4096 + 16,
        "allocated_size": 5 * 4096 + 16,
        "active_size": 5 * 4096 + 16,
        "requested_size": 5 * 4096 + 16,
        "stream": 0,
        "segment_type": "cpu",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": [
            {
                "address": before.data_ptr(),
                "size": 5 * 4096 + 16,
                "requested_size": 5 * 4096 + 16,
                "state": "active_allocated",
                "frames": [],
            }
        ],
    }
    (block,) = segments[during.data_ptr()]["blocks"]
    assert block["frames"][0] == here("kept", "keep_one")
    assert block["frames"] is alloc_at(trace, during.data_ptr())["frames"]
    # Every CPU allocation alive at the stop is a segment, traced or not.
    assert replay(trace) == {a: s["total_size"] for a, s in segments.items()}


def test_a_tensor_made_in_one_trace_has_no_frames_in_the_next():
    _core._cpu_trace_start(100)
    t = keep_one()
    first = _core._cpu_trace_stop()
    assert alloc_at(first, t.data_ptr())["frames"][0] == here("kept", "keep_one")
    _core._cpu_trace_start(100)
    second = _core._cpu_trace_stop()
    assert [t.data_ptr(), 3 * 4096 + 8] in second["memlab_rs"]["start"]["live"]
    (segment,) = [s for s in second["segments"] if s["address"] == t.data_ptr()]
    assert segment["blocks"][0]["frames"] == []


# --- allocations inside operators ------------------------------------------------------------


def test_an_out_argument_and_a_temporary_inside_an_operator_are_recorded():
    a, b = torch.randn(64, 32), torch.randn(32, 16)
    out = torch.empty(0)
    logits, target = torch.randn(64, 1000), torch.randint(1000, (64,))
    caller = "test_an_out_argument_and_a_temporary_inside_an_operator_are_recorded"
    _core._cpu_trace_start(10_000)
    torch.mm(a, b, out=out)  # LINE: mm_out
    loss = F.cross_entropy(logits, target)  # LINE: cross_entropy
    trace = _core._cpu_trace_stop()
    # out= resized inside mm: 64 x 16 floats, made on the mm line.
    mm = alloc_at(trace, out.data_ptr())
    assert mm["size"] == 64 * 16 * 4
    assert mm["frames"][0] == here("mm_out", caller)
    # log_softmax's 64 x 1000 floats inside cross_entropy: made and freed inside the op.
    temporaries = [
        e for e in entries(trace) if e["action"] == "alloc" and e["size"] == 64 * 1000 * 4
    ]
    assert len(temporaries) == 1
    (temporary,) = temporaries
    assert here("cross_entropy", caller) in temporary["frames"]
    assert temporary["frames"][0]["filename"] == F.__file__
    actions = at(trace, temporary["addr"])
    assert actions == [
        ("alloc", 256000),
        ("free_requested", 256000),
        ("free_completed", 256000),
    ]
    # The loss itself (one float) and nll_loss's total weight (one float, freed at once).
    assert alloc_at(trace, loss.data_ptr())["size"] == 4
    assert alloc_at(trace, loss.data_ptr())["frames"][1] == here("cross_entropy", caller)
    sizes = [(e["action"], e["size"]) for e in entries(trace) if e["addr"] != out.data_ptr()]
    assert sorted(sizes) == sorted(
        [("alloc", 256000), ("alloc", 4), ("alloc", 4)]
        + [("free_requested", 4), ("free_completed", 4)]
        + [("free_requested", 256000), ("free_completed", 256000)]
    )


# --- threads -------------------------------------------------------------------------------------


def worker_body(out):
    out.append(torch.empty(1024, 256))  # LINE: worker


def test_an_allocation_on_a_python_thread_carries_that_threads_stack():
    out = []
    _core._cpu_trace_start(1000)
    thread = threading.Thread(target=worker_body, args=(out,))
    thread.start()
    thread.join()
    trace = _core._cpu_trace_stop()
    frames = alloc_at(trace, out[0].data_ptr())["frames"]
    assert frames[0] == here("worker", "worker_body")
    names = [f["name"] for f in frames]
    assert names[1:] == ["run", "_bootstrap_inner", "_bootstrap"]
    assert all(f["filename"] == threading.__file__ for f in frames[1:])
    assert trace["memlab_rs"]["no_stack"] == 0


def inter_op_allocator():
    """A TorchScript function whose allocation runs on torch's inter-op pool: a C++
    thread with no Python thread state."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script is deprecated

        @torch.jit.script
        def inner(n: int):
            return torch.empty(n, dtype=torch.uint8)

        @torch.jit.script
        def forks(n: int):
            return torch.jit.wait(torch.jit.fork(inner, n))

    return forks


def test_an_allocation_on_a_thread_without_python_is_recorded_without_a_stack():
    forks = inter_op_allocator()
    forks(10)  # warm up the pool
    _core._cpu_trace_start(1000)
    t = forks(777_777)
    trace = _core._cpu_trace_stop()
    entry = alloc_at(trace, t.data_ptr())
    assert entry["size"] == 777_777
    assert entry["frames"] == []
    assert trace["memlab_rs"]["no_stack"] == 1


def churn(nbytes):
    t = torch.empty(nbytes, dtype=torch.uint8)  # LINE: churn
    del t


def churn_until(stop: threading.Event, calls: dict[int, int], nbytes: int) -> None:
    n = 0
    while not stop.is_set():
        churn(nbytes)
        n += 1
        if n % 50 == 0:
            stop.wait(0.001)  # leave the main thread some CPU on a small machine
    calls[nbytes] = calls.get(nbytes, 0) + n


def test_threads_allocating_while_tracing_give_a_consistent_trace():
    stop, calls = threading.Event(), {}
    threads = [
        threading.Thread(target=churn_until, args=(stop, calls, 4096 + 8 * i)) for i in range(3)
    ]
    kept = []
    _core._cpu_trace_start(1_000_000)
    for thread in threads:
        thread.start()
    for _ in range(300):
        kept.append(torch.empty(4096 * 3, dtype=torch.uint8))
    stop.set()
    for thread in threads:
        thread.join()
    trace = _core._cpu_trace_stop()
    assert trace["memlab_rs"]["dropped"] == 0
    assert replay(trace) == {s["address"]: s["total_size"] for s in trace["segments"]}
    for i in range(3):
        made = [e for e in entries(trace) if e["action"] == "alloc" and e["size"] == 4096 + 8 * i]
        assert len(made) == calls[4096 + 8 * i] > 0
        assert all(e["frames"][0] == here("churn", "churn") for e in made)
        assert all(e["frames"][1]["name"] == "churn_until" for e in made)
    for t in kept:
        assert alloc_at(trace, t.data_ptr())["size"] == 4096 * 3


def test_traces_started_and_stopped_while_threads_allocate_are_each_consistent():
    # An allocation in flight when a trace starts is either alive in start.live or an
    # entry of the trace, never neither: the hook looks at the trace again under the
    # table's lock, which the start holds while it reads start.live.
    stop = threading.Event()

    def churn_fast(nbytes):
        while not stop.is_set():
            t = torch.empty(nbytes, dtype=torch.uint8)
            del t

    threads = [threading.Thread(target=churn_fast, args=(4096 + 8 * i,)) for i in range(2)]
    assert _core._cpu_start() == "allocator"  # the hook stays: starts are quick, and many
    for thread in threads:
        thread.start()
    try:
        for _ in range(5000):
            _core._cpu_trace_start(1_000_000)
            trace = _core._cpu_trace_stop()
            assert trace["memlab_rs"]["dropped"] == 0
            assert replay(trace) == {s["address"]: s["total_size"] for s in trace["segments"]}
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        _core._cpu_stop()
    assert_nothing_installed()


# --- tags --------------------------------------------------------------------------------------


def test_the_tag_is_the_user_metadata_of_later_entries_on_its_thread_only():
    def other_thread(out):
        out.append(torch.empty(1001, dtype=torch.uint8))
        _core._cpu_trace_set_tag("backward:decoder")
        out.append(torch.empty(1002, dtype=torch.uint8))
        _core._cpu_trace_set_tag("")

    out = []
    before = torch.empty(999, dtype=torch.uint8)
    _core._cpu_trace_set_tag("forward:encoder.layer.0")
    try:
        _core._cpu_trace_start(1000)
        tagged = torch.empty(1000, dtype=torch.uint8)
        thread = threading.Thread(target=other_thread, args=(out,))
        thread.start()
        thread.join()
        address = tagged.data_ptr()
        del before  # freed under this thread's tag
        _core._cpu_trace_set_tag("")
        untagged = torch.empty(1003, dtype=torch.uint8)
        del tagged  # freed with no tag
        trace = _core._cpu_trace_stop()
    finally:
        _core._cpu_trace_set_tag("")
    meta = {(e["action"], e["size"]): e["user_metadata"] for e in entries(trace)}
    assert meta[("alloc", 1000)] == "forward:encoder.layer.0"
    assert meta[("alloc", 1001)] == ""
    assert meta[("alloc", 1002)] == "backward:decoder"
    assert meta[("alloc", 1003)] == ""
    assert meta[("free_requested", 999)] == meta[("free_completed", 999)]
    assert meta[("free_completed", 999)] == "forward:encoder.layer.0"
    assert meta[("free_completed", 1000)] == ""
    assert at(trace, address)[0] == ("alloc", 1000)
    assert untagged.nbytes == 1003
    # One string object per tag, shared by its entries.
    tags = [e["user_metadata"] for e in entries(trace) if e["size"] in (999, 1000)]
    assert tags[0] is tags[1]


# --- the ring buffer, and shared frames ------------------------------------------------------


def test_max_entries_keeps_the_newest_entries_and_counts_the_dropped_ones():
    kept = []
    _core._cpu_trace_start(10)
    for _ in range(30):
        kept.append(torch.empty(2048, dtype=torch.uint8))  # LINE: ring
    trace = _core._cpu_trace_stop()
    assert [(e["action"], e["addr"], e["size"]) for e in entries(trace)] == [
        ("alloc", t.data_ptr(), 2048) for t in kept[20:]
    ]
    assert trace["memlab_rs"]["dropped"] == 20
    assert trace["memlab_rs"]["no_stack"] == 0
    # The dropped allocations are still alive, still segments, and keep their frames.
    segments = {s["address"]: s for s in trace["segments"]}
    assert segments[kept[0].data_ptr()]["blocks"][0]["frames"][0]["line"] == LINES["ring"]


def two_lines():
    a = torch.empty(100, dtype=torch.uint8)  # LINE: first
    b = torch.empty(200, dtype=torch.uint8)  # LINE: second
    return a, b


def test_frame_dicts_are_shared_objects_between_entries():
    _core._cpu_trace_start(1000)
    pairs = [two_lines() for _ in range(3)]  # LINE: shared_call
    trace = _core._cpu_trace_stop()
    firsts = [alloc_at(trace, a.data_ptr())["frames"] for a, _ in pairs]
    seconds = [alloc_at(trace, b.data_ptr())["frames"] for _, b in pairs]
    assert firsts[0][0] == here("first", "two_lines")
    assert seconds[0][0] == here("second", "two_lines")
    # The same (code, line): the same dict; so is the caller's frame across both lines.
    assert all(f[0] is firsts[0][0] for f in firsts)
    assert all(s[0] is seconds[0][0] for s in seconds)
    assert firsts[0][0] is not seconds[0][0]
    assert firsts[0][1] is seconds[0][1]
    assert firsts[0][1]["line"] == LINES["shared_call"]


def recurse(depth):
    if depth == 0:
        return torch.empty(4096, dtype=torch.uint8)  # LINE: deep
    return recurse(depth - 1)


def test_a_deep_stack_keeps_its_innermost_frames():
    _core._cpu_trace_start(100)
    t = recurse(200)
    trace = _core._cpu_trace_stop()
    frames = alloc_at(trace, t.data_ptr())["frames"]
    assert len(frames) == MAX_DEPTH
    assert frames[0] == here("deep", "recurse")
    assert all(f["name"] == "recurse" for f in frames)


# --- starting and stopping ------------------------------------------------------------------


def test_start_twice_stop_without_start_and_bad_sizes_are_clear_errors():
    with pytest.raises(RuntimeError, match="no CPU trace is running"):
        _core._cpu_trace_stop()
    with pytest.raises(ValueError, match="max_entries must be at least 1"):
        _core._cpu_trace_start(0)
    _core._cpu_trace_start(10)
    try:
        with pytest.raises(RuntimeError, match="already running"):
            _core._cpu_trace_start(10)
        assert _core._cpu_trace_active()
    finally:
        _core._cpu_trace_stop()
    assert_nothing_installed()


def test_without_the_allocator_hook_start_says_why(monkeypatch):
    monkeypatch.setenv("MEMLAB_RS_CPU_SOURCE", "dispatch")
    with pytest.raises(RuntimeError, match=r"needs the allocator hook.*MEMLAB_RS_CPU_SOURCE"):
        _core._cpu_trace_start(10)
    assert_nothing_installed()


def stats() -> dict[str, int]:
    return dict(_core._cpu_stats())


def test_start_and_stop_50_times_leave_the_counters_and_slots_as_before():
    # 50: each start walks the heap once for the CPU source's baseline (late in a suite,
    # ~50 ms on 3.13: 1000 took 51 s there, 200 took 10 s)
    assert_nothing_installed()
    first = None
    for _ in range(50):
        _core._cpu_trace_start(100)
        t = torch.empty(4099 * 2, dtype=torch.uint8)
        address = t.data_ptr()
        del t
        trace = _core._cpu_trace_stop()
        assert at(trace, address) == [
            ("alloc", 8198),
            ("free_requested", 8198),
            ("free_completed", 8198),
        ]
        assert_nothing_installed()
        after = stats()
        if first is None:
            first = after
        assert after == first  # each start counts afresh: exactly this run, no drift
    assert first["allocated_bytes.all.allocated"] == 8198
    assert first["allocated_bytes.all.freed"] == 8198


def test_a_trace_shares_the_hook_with_a_line_profiler():
    with LineProfiler(churn, device="cpu") as lp:
        for _ in range(50):
            _core._cpu_trace_start(100)
            churn(8192)
            trace = _core._cpu_trace_stop()
            assert [a for a, _ in at(trace, entries(trace)[0]["addr"])][0] == "alloc"
            assert _core._cpu_mode() == "allocator" and all(hook_slots_ours())
        churn(8192)
    assert_nothing_installed()
    (row,) = [r for r in lp.display(churn).records() if "torch.empty(nbytes" in r["code"]]
    assert row["hits"] == 51


def test_a_keyboard_interrupt_inside_traced_code_leaves_nothing_installed_after_stop():
    # Python's own SIGINT handler for the test (interrupt_main does nothing where SIGINT is
    # ignored or left to the OS, as an earlier test or a runner may leave it), and a
    # deadline: an interrupt that never arrives fails the test instead of hanging the run.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    kept = []
    try:
        for _ in range(5):
            _core._cpu_trace_start(10_000_000)
            try:
                timer = threading.Timer(0.02, _thread.interrupt_main)
                timer.start()
                deadline = time.monotonic() + 60
                with pytest.raises(KeyboardInterrupt):
                    while time.monotonic() < deadline:
                        kept.append(torch.empty(64, dtype=torch.uint8))
                        if len(kept) > 100:
                            kept.clear()
                timer.join()
            finally:
                trace = _core._cpu_trace_stop()
            _check_interrupted_trace(trace)
    finally:
        signal.signal(signal.SIGINT, previous)


def _check_interrupted_trace(trace):
    """What an interrupted recording holds: nothing installed, nothing dropped, a replay
    that rebuilds its segments, every 64-byte allocation of the loop."""
    assert_nothing_installed()
    assert trace["memlab_rs"]["dropped"] == 0
    assert replay(trace) == {s["address"]: s["total_size"] for s in trace["segments"]}
    assert len(entries(trace)) > 100
    assert all(e["size"] == 64 for e in entries(trace))
