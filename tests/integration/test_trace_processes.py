"""The trace across processes: what needs a fresh interpreter, a fork or another program.

- torch's own command line tools (``python -m torch.cuda._memory_viz``) read the pickle
  ``export_memory_viz`` writes;
- the streaming pickle reader's memory on a 32 MB snapshot, measured in fresh processes
  against ``pickle.load`` and the dict reader;
- the CPU recorder across fork (the child records on its own, nothing of the parent's trace
  or hook is left in it), while a collection runs finalisers as a stack is read, and at
  interpreter exit with a trace still running and threads allocating.

Their in-process counterparts are tests/unit/trace/ (test_memory_viz_export.py,
test_trace_stream.py, test_trace_cpu_record.py).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
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
from trace_snapshots import cpu_recording, fixture

from memlab_rs import LineProfiler, _core
from memlab_rs.trace.memory_viz import export_memory_viz

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


# --- torch's tools read what export_memory_viz writes ------------------------------------------


def test_torch_command_line_tools_read_the_pickle(tmp_path):
    path = export_memory_viz(cpu_recording(), tmp_path / "cpu.pickle")
    for action, expected in (("stats", "total_allocated: 3.0MiB"), ("trace", "4 entries")):
        done = subprocess.run(
            [sys.executable, "-m", "torch.cuda._memory_viz", action, str(path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert expected in done.stdout


# --- the streaming reader's memory, in fresh processes --------------------------------------


def write(path, snapshot, protocol):
    with open(path, "wb") as f:
        pickle.dump(snapshot, f, protocol=protocol)
    return path


MEASURE = textwrap.dedent(
    """
    import json, pickle, sys, time
    import memlab_rs.trace as trace

    def hwm():  # this process's peak RSS (ru_maxrss would keep the parent's across exec)
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))

    how, path = sys.argv[1], sys.argv[2]
    base = hwm()
    began = time.perf_counter()
    if how == "stream":
        result = trace.load(path)
    else:
        with open(path, "rb") as f:
            result = trace.load(pickle.load(f))
    text = result.text()
    seconds = time.perf_counter() - began
    peak = hwm()
    print(json.dumps({"base": base, "peak": peak, "seconds": seconds, "text": text}))
    """
)


def big_snapshot(path, target_bytes):
    """The gpt2 fixture's history repeated with shifted addresses and times until the pickle
    is about `target_bytes`; frame dicts shared, frame lists per copy (as torch writes)."""
    snapshot, _ = fixture("gpt2_tiny")
    entries0 = snapshot["device_traces"][0]
    one = len(pickle.dumps(snapshot, protocol=4))
    copies = max(1, target_bytes // one)
    period = entries0[-1]["time_us"] - entries0[0]["time_us"] + 1000
    entries, segments = [], []
    for k in range(copies):
        lists = {}

        def shifted(item, key, k=k, lists=lists):
            out = dict(item)
            if key in out and out.get("action") not in ("snapshot", "oom"):
                out[key] += k << 36
            if "time_us" in out:
                out["time_us"] += k * period
            if "frames" in out:
                out["frames"] = lists.setdefault(id(item["frames"]), list(item["frames"]))
            return out

        entries.extend(shifted(e, "addr") for e in entries0)
        for seg in snapshot["segments"]:
            copy = shifted(seg, "address")
            copy["blocks"] = [shifted(b, "address") for b in seg["blocks"]]
            segments.append(copy)
    write(path, dict(snapshot, segments=segments, device_traces=[entries]), 4)
    return copies, len(entries)


# Big enough that the pickle's dict dwarfs the fixed costs (the imports are measured out),
# small enough to build and load in seconds on every Python CI runs.
SIZE = 32 << 20


def measure(how, path):
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, how, str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM (Linux)")
def test_a_32mb_snapshot_streams_in_a_fraction_of_pickle_loads_memory(tmp_path):
    path = tmp_path / "big.pickle"
    copies, entries = big_snapshot(path, SIZE)
    size = os.path.getsize(path)
    stream = measure("stream", path)
    dict_path = measure("pickle", path)
    assert stream["text"] == dict_path["text"]
    mib = 1 << 20
    grew = {
        k: (v["peak"] - v["base"]) / mib for k, v in (("stream", stream), ("pickle", dict_path))
    }
    print(
        f"\n{size / mib:.0f} MiB pickle ({copies} copies, {entries:,} entries): "
        f"peak RSS above the imports: stream {grew['stream']:.0f} MiB in "
        f"{stream['seconds']:.2f} s, pickle.load + dict {grew['pickle']:.0f} MiB in "
        f"{dict_path['seconds']:.2f} s"
    )
    # Measured: 30 MiB, 341k entries: stream +32 MiB, pickle.load + dict +176 MiB (at 93 MiB
    # it was +97 against +552: the ratio holds as the file grows).
    assert grew["stream"] * 3 < grew["pickle"]


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
    for _ in range(4):
        out = script(source)
        assert out == "True\n"
