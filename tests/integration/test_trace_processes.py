"""The CPU trace across processes, where the interpreter's behaviour matters (noxfile.py runs
this file on the oldest and the newest CPython): the CPU recorder across fork (the child
records on its own, nothing of the parent's trace or hook is left in it), while a collection
runs finalisers as a stack is read, and at interpreter exit with a trace still running and
threads allocating.

The trace's files across processes are in test_trace_files_processes.py; the in-process
counterparts are tests/unit/trace/ (test_trace_cpu_record.py).
"""

from __future__ import annotations

import json
import os
import sys
import threading

import pytest
import torch
from cpu_trace import (  # no_trace_left: an autouse fixture
    alloc_at,
    assert_nothing_installed,
    entries,
    hook_slots_ours,
    marked_lines,
    no_trace_left,  # noqa: F401
    replay,
)

from memlab_rs import LineProfiler, _core

HERE = os.path.abspath(__file__)
LINES = marked_lines(HERE)
linux_only = pytest.mark.skipif(
    sys.platform != "linux", reason="the allocator hook rewrites ELF GOT slots (Linux)"
)
fork_with_threads = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded, use of fork:DeprecationWarning"
)


def here(marker: str, function: str) -> dict:
    return {"filename": HERE, "line": LINES[marker], "name": function}


# --- the CPU recorder across fork --------------------------------------------------------------


def keep_one():
    return torch.empty(3 * 4096 + 8, dtype=torch.uint8)  # LINE: kept


def churn(nbytes):
    t = torch.empty(nbytes, dtype=torch.uint8)
    del t


def churn_until(stop: threading.Event, calls: dict[int, int], nbytes: int) -> None:
    n = 0
    while not stop.is_set():
        churn(nbytes)
        n += 1
        if n % 50 == 0:
            stop.wait(0.001)  # leave the main thread some CPU on a small machine
    calls[nbytes] = calls.get(nbytes, 0) + n


# Bits of a forked child's exit status: which check failed.
STILL_TRACING, STOP_WORKED, HOOK_LEFT, OWN_TRACE_WRONG, RAISED = 1, 2, 4, 8, 16
CHILD_BYTES = 7 * 4096 + 24


def child_checks(alone: bool) -> int:
    """In a child forked while the parent traced: no trace runs, the parent's cannot be
    stopped here, and the child can trace on its own."""
    failed = 0
    if _core._cpu_trace_active():
        failed |= STILL_TRACING
    try:
        _core._cpu_trace_stop()
        failed |= STOP_WORKED
    except RuntimeError:
        pass
    if alone and (_core._cpu_mode() is not None or any(hook_slots_ours())):
        failed |= HOOK_LEFT
    _core._cpu_trace_start(100)
    t = keep_one()
    trace = _core._cpu_trace_stop()
    own = [(e["action"], e["size"]) for e in entries(trace)]
    if own != [("alloc", 3 * 4096 + 8)] or alloc_at(trace, t.data_ptr())["frames"][0] != here(
        "kept", "keep_one"
    ):
        failed |= OWN_TRACE_WRONG
    if alone and (_core._cpu_mode() is not None or any(hook_slots_ours())):
        failed |= HOOK_LEFT
    return failed


def fork_running(alone: bool) -> int:
    pid = os.fork()
    if pid == 0:
        code = RAISED
        try:
            code = child_checks(alone)
        finally:
            os._exit(code)
    return pid


@linux_only
@fork_with_threads
def test_fork_while_tracing_and_other_threads_allocate(wait_child):
    # 40 forks: the workers' churn the trace records grows with the time forks take (100
    # forks took 32 s on 3.13, most of it recording and replaying that churn)
    forks = 40
    stop, calls = threading.Event(), {}
    threads = [threading.Thread(target=churn_until, args=(stop, calls, 4096)) for _ in range(2)]
    kept = []
    _core._cpu_trace_start(10_000_000)
    try:
        for thread in threads:
            thread.start()
        statuses = []
        for _ in range(forks):
            pid = fork_running(alone=True)
            kept.append(torch.empty(CHILD_BYTES + 1, dtype=torch.uint8))
            statuses.append(wait_child(pid))
        stop.set()
        for thread in threads:
            thread.join()
    finally:
        stop.set()
        trace = _core._cpu_trace_stop()
    assert_nothing_installed()
    assert statuses == [0] * forks, sorted(set(statuses))
    # The parent's trace is whole: its own allocations and its workers', none of a child's.
    assert trace["memlab_rs"]["dropped"] == 0
    assert replay(trace) == {s["address"]: s["total_size"] for s in trace["segments"]}
    sizes = [e["size"] for e in entries(trace) if e["action"] == "alloc"]
    assert sizes.count(CHILD_BYTES + 1) == forks
    assert sizes.count(4096) == calls[4096] > 0
    assert sizes.count(3 * 4096 + 8) == 0


@linux_only
@fork_with_threads
def test_fork_while_a_line_profiler_also_counts(wait_child):
    # The child keeps nothing of the parent's trace; the line profiler's own handler
    # releases its use of the hook, so the child ends with nothing installed.
    with LineProfiler(churn, device="cpu"):
        _core._cpu_trace_start(1000)
        try:
            pid = fork_running(alone=True)
            assert wait_child(pid) == 0
            churn(5000)
        finally:
            trace = _core._cpu_trace_stop()
    assert_nothing_installed()
    assert [e["size"] for e in entries(trace) if e["action"] == "alloc"] == [5000]


# --- collections, finalisers and interpreter exit, in fresh interpreters ---------------------


@linux_only
def test_a_collection_with_finalisers_during_a_traced_allocation_does_not_deadlock(script):
    # Reading a deep stack on 3.11 makes a frame object per frame, and making one may run a
    # collection right there. Here a garbage cycle waits for it, with a collection due a
    # few objects later: its finaliser frees a tensor (the free hook takes the table's
    # lock, so the stack must be read before the allocation hook takes it) and allocates
    # one (while the stack is being read: recorded without a stack). The cycle's tensor is
    # made at module level, so no frame of `descend` exists before the traced allocation.
    # gc.collect() inside the traced region too.
    out = script(
        """
        import gc, json, sys, torch
        from memlab_rs import _core

        made = []

        class Cycle:
            def __init__(self, tensor):
                self.me = self
                self.tensor = tensor

            def __del__(self):
                self.tensor = None
                made.append(torch.empty(8192, dtype=torch.uint8))

        def descend(depth, box):
            if depth == 0:
                gc.disable()
                Cycle(box.pop())
                gc.set_threshold(gc.get_count()[0] + 10)
                gc.enable()
                return torch.empty(1 << 16, dtype=torch.uint8)
            return descend(depth - 1, box)

        _core._cpu_trace_start(1_000_000)
        try:
            kept = [descend(60, [torch.empty(4096, dtype=torch.uint8)]) for _ in range(300)]
            gc.collect()
        finally:
            gc.set_threshold(700, 10, 10)
            trace = _core._cpu_trace_stop()
        entries = trace["device_traces"][0]
        mine = [e for e in entries if e["action"] == "alloc" and e["size"] == 1 << 16]
        finalised = [e for e in entries if e["action"] == "alloc" and e["size"] == 8192]
        freed = [e for e in entries if e["action"] == "free_completed" and e["size"] == 4096]
        print(json.dumps({
            "mine": len(mine),
            "mine_with_stack": sum(
                [f["name"] for f in e["frames"][:61]] == ["descend"] * 61
                # 3.12+ inline the comprehension (PEP 709)
                and e["frames"][61]["name"] in ("<listcomp>", "<module>")
                for e in mine
            ),
            "finalised": len(finalised),
            "finalised_without_stack": sum(e["frames"] == [] for e in finalised),
            "freed": len(freed),
            "made": len(made),
            "no_stack": trace["memlab_rs"]["no_stack"],
            "version": list(sys.version_info[:2]),
        }))
        """,
        timeout=120,  # a few seconds; a deadlock ends here
    )
    result = json.loads(out)
    assert result["mine"] == result["mine_with_stack"] == 300, result
    assert result["finalised"] == result["made"] == result["freed"] == 300, result
    assert result["no_stack"] == result["finalised_without_stack"], result
    if tuple(result["version"]) == (3, 11):
        # 3.11 makes frame objects while the stack is read, and collects right there.
        assert result["finalised_without_stack"] > 0, result
    else:
        # 3.9/3.10 have every frame object already; 3.12+ collect only between bytecodes.
        assert result["finalised_without_stack"] == 0, result


@linux_only
def test_the_interpreter_exits_cleanly_with_a_trace_running_and_threads_allocating(script):
    # The trace is never stopped: the hook records through the whole teardown, where stacks
    # are not read any more (Py_IsInitialized is 0). Non-daemon threads allocate while the
    # interpreter waits for them; daemon threads loop around torch calls and are parked
    # between two by an atexit handler (torch itself aborts the process when a daemon
    # thread is inside an operator that released the GIL as the interpreter finalises, with
    # or without memlab_rs: see tests/helpers/cpu_exit_children.py).
    source = """
        import atexit, threading, torch
        from memlab_rs import _core

        GATE = threading.Lock()

        def endless():
            while True:
                with GATE:
                    t = torch.empty(4096, dtype=torch.uint8)
                    del t

        def past_exit(started):
            main, i = threading.main_thread(), 0
            while main.is_alive() or i < 50:
                if not main.is_alive():
                    i += 1
                t = torch.empty(12288, dtype=torch.uint8)
                del t
                started.set()

        _core._cpu_trace_start(1000)
        started = threading.Event()
        for _ in range(2):
            threading.Thread(target=endless, daemon=True).start()
        for _ in range(2):
            threading.Thread(target=past_exit, args=(started,)).start()
        started.wait()
        atexit.register(GATE.acquire)
        kept = [torch.empty(1 << 20) for _ in range(5)]
        print(_core._cpu_trace_active())
        """
    for _ in range(2):  # each a fresh interpreter with torch (~2.5 s of CPU)
        out = script(source)
        assert out == "True\n"
