"""The line profiler as a good neighbour: other tracers, profilers and coverage keep
working, a replaced tracer is said so, and a dropped profiler leaves nothing installed.
(What needs a process of its own, a fork among them, is in
tests/integration/test_line_profiler_processes.py.)

On Python 3.12+ the profiler uses its own ``sys.monitoring`` tool id (3 or 4); on 3.9-3.11
a C trace function chained in front of each thread's own tracer.
"""

from __future__ import annotations

import gc
import os
import re
import sys
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memlab_rs import LineProfiler, _core

MiB = 1 << 20
MONITORING = sys.version_info >= (3, 12)
needs_monitoring = pytest.mark.skipif(
    not MONITORING, reason="sys.monitoring (tool ids, cProfile's PROFILER_ID) exists from 3.12"
)
needs_settrace = pytest.mark.skipif(
    MONITORING, reason="on 3.12+ the profiler uses sys.monitoring and leaves sys.settrace alone"
)
COLUMNS = ("allocated_bytes.all.allocated", "allocated_bytes.all.current")


def by_line(lp, func, columns=COLUMNS):
    return {r["code"].strip(): r for r in lp.display(func, columns).records()}


def our_tool_ids():
    return [i for i in range(6) if sys.monitoring.get_tool(i) == "memlab_rs"]


def work():
    a = torch.empty(256, 1024)
    b = torch.empty(512, 1024)
    return a, b


def plain(n):
    total = 0
    for i in range(n):
        total += i
    return total


def assert_work_profiled(lp):
    lines = by_line(lp, work)
    assert lines["a = torch.empty(256, 1024)"]["allocated_bytes.all.allocated"] == MiB
    assert lines["b = torch.empty(512, 1024)"]["allocated_bytes.all.allocated"] == 2 * MiB


# --- 3.12+: sys.monitoring tool ids -------------------------------------------------


@needs_monitoring
def test_profiler_never_takes_the_profiler_tool_id():
    with LineProfiler(work, device="cpu"):
        assert sys.monitoring.get_tool(sys.monitoring.PROFILER_ID) is None
        assert our_tool_ids() in ([3], [4])
    assert our_tool_ids() == []


@needs_monitoring
def test_cprofile_runs_while_enabled():
    import cProfile
    import pstats

    with LineProfiler(work, device="cpu") as lp:
        # The first CPU dispatch imports parts of torch lazily, which cProfile on 3.12 does
        # not always follow: warm up outside cProfile.
        work()
        prof = cProfile.Profile()
        prof.enable()
        work()
        plain(2)
        prof.disable()
    names = {name for (_, _, name) in pstats.Stats(prof).stats}
    assert {"work", "plain"} <= names
    assert_work_profiled(lp)
    assert by_line(lp, work)["a = torch.empty(256, 1024)"]["hits"] == 2


@needs_monitoring
def test_cprofile_started_first_keeps_running():
    import cProfile
    import pstats

    work()  # warm up the first CPU dispatch (see above)
    prof = cProfile.Profile()
    prof.enable()
    try:
        with LineProfiler(work, device="cpu") as lp:
            work()
            plain(2)
    finally:
        prof.disable()
    assert {"work", "plain"} <= {name for (_, _, name) in pstats.Stats(prof).stats}
    assert_work_profiled(lp)


@needs_monitoring
@pytest.mark.parametrize("core", ["sysmon", "ctrace"])
def test_coverage_runs_while_enabled(monkeypatch, core):
    import coverage  # a test dependency (requirements-test.txt): never skipped
    monkeypatch.setenv("COVERAGE_CORE", core)
    cov = coverage.Coverage(data_file=None, include=[__file__])
    with LineProfiler(work, device="cpu") as lp:
        cov.start()
        try:
            work()
            plain(3)
        finally:
            cov.stop()
    covered = set(cov.get_data().lines(__file__) or ())
    first = plain.__code__.co_firstlineno
    assert {first + 1, first + 2, first + 3, first + 4} <= covered
    assert_work_profiled(lp)


@needs_monitoring
def test_a_taken_tool_id_falls_back_to_the_other():
    sys.monitoring.use_tool_id(3, "someone")
    try:
        with LineProfiler(work, device="cpu") as lp:
            assert our_tool_ids() == [4]
            work()
        assert_work_profiled(lp)
    finally:
        sys.monitoring.free_tool_id(3)


@needs_monitoring
def test_all_tool_ids_taken_is_a_clear_error():
    sys.monitoring.use_tool_id(3, "tool three")
    sys.monitoring.use_tool_id(4, "tool four")
    try:
        lp = LineProfiler(work, device="cpu")
        with pytest.raises(RuntimeError, match="tool three.*tool four"):
            lp.enable()
        assert not lp.enabled
    finally:
        sys.monitoring.free_tool_id(3)
        sys.monitoring.free_tool_id(4)
    with LineProfiler(work, device="cpu") as lp:
        work()
    assert_work_profiled(lp)


# --- 3.9-3.11: each thread keeps its own tracer --------------------------------------


class Recorder:
    """A sys.settrace tracer that records the functions it sees called."""

    def __init__(self):
        self.calls = []

    def __call__(self, frame, event, arg):
        if event == "call":
            self.calls.append(frame.f_code.co_name)
        return None


@needs_settrace
def test_a_worker_threads_own_tracer_survives_enable_and_disable():
    recorder = Recorder()
    ready, profiled, done = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def worker():
        sys.settrace(recorder)
        ready.set()
        profiled.wait(30)
        work()  # runs while the profiler is enabled
        seen["during"] = sys.gettrace()
        done.wait(30)
        plain(2)  # runs after disable()
        seen["after"] = sys.gettrace()
        sys.settrace(None)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        ready.wait(30)
        with LineProfiler(work, device="cpu") as lp:
            profiled.set()
            while "during" not in seen and thread.is_alive():
                thread.join(0.01)
    finally:
        profiled.set()
        done.set()
        thread.join(30)
    assert seen["after"] is recorder
    # The tracer saw calls while the profiler was enabled and after it.
    assert "work" in recorder.calls and "plain" in recorder.calls
    assert_work_profiled(lp)


@needs_settrace
def test_the_enabling_threads_tracer_keeps_running_and_comes_back():
    recorder = Recorder()
    sys.settrace(recorder)
    try:
        with LineProfiler(work, device="cpu") as lp:
            work()
            plain(1)
        assert sys.gettrace() is recorder
    finally:
        sys.settrace(None)
    assert "work" in recorder.calls and "plain" in recorder.calls
    assert_work_profiled(lp)


@needs_settrace
def test_coverage_on_a_worker_thread_survives(tmp_path):
    import coverage  # a test dependency (requirements-test.txt): never skipped
    ready, go, done = threading.Event(), threading.Event(), threading.Event()
    result = {}

    def worker():
        cov = coverage.Coverage(data_file=None, include=[__file__])
        cov.start()
        ready.set()
        go.wait(30)
        plain(3)
        cov.stop()
        result["lines"] = set(cov.get_data().lines(__file__) or ())
        done.set()

    thread = threading.Thread(target=worker)
    thread.start()
    ready.wait(30)
    with LineProfiler(work, device="cpu"):
        work()
    go.set()
    thread.join(60)
    first = plain.__code__.co_firstlineno
    assert {first + 1, first + 2, first + 3, first + 4} <= result["lines"]


@needs_settrace
def test_threads_started_while_enabled_keep_a_threading_settrace_hook():
    recorder = Recorder()
    threading.settrace(recorder)
    try:
        with LineProfiler(work, device="cpu") as lp:
            thread = threading.Thread(target=work)
            thread.start()
            thread.join()
        # threading.gettrace() is 3.10+; 3.9 keeps the hook in threading._trace_hook
        assert getattr(threading, "gettrace", lambda: threading._trace_hook)() is recorder
    finally:
        threading.settrace(None)
    assert "work" in recorder.calls
    assert_work_profiled(lp)


@needs_settrace
def test_a_thread_starting_while_enable_runs_is_profiled_without_a_false_notice():
    # threading's bootstrap sets the threading.settrace hook after start() returns: hold
    # it there (it waits for this lock) until the profiler is enabled.
    with threading._active_limbo_lock:
        thread = threading.Thread(target=work)
        thread.start()
        lp = LineProfiler(work, device="cpu")
        lp.enable()
    thread.join()
    lp.disable()
    assert_work_profiled(lp)
    assert lp.display().notices == []


# --- sys.settrace() inside profiled code (3.9-3.11) ----------------------------------


def replaces_the_tracer():
    a = torch.empty(256, 1024)
    sys.settrace(None)
    b = torch.empty(512, 1024)
    c = torch.empty(1024, 1024)
    return a, b, c


@needs_settrace
def test_settrace_inside_profiled_code_stops_there_and_says_so():
    with LineProfiler(replaces_the_tracer, device="cpu") as lp:
        replaces_the_tracer()
    lines = by_line(lp, replaces_the_tracer)
    assert lines["a = torch.empty(256, 1024)"]["allocated_bytes.all.allocated"] == MiB
    # The line that replaced the tracer is closed when it did, not charged with the rest.
    assert lines["sys.settrace(None)"]["allocated_bytes.all.allocated"] == 0
    assert lines["b = torch.empty(512, 1024)"]["hits"] == 0
    shown = lp.display(replaces_the_tracer, COLUMNS)
    line = replaces_the_tracer.__code__.co_firstlineno + 2
    expected = (
        f"profiling stopped on thread {threading.get_ident()} at {__file__}:{line}: "
        "sys.settrace() replaced the profiler's tracer"
    )
    assert expected in shown.notices
    assert expected in str(shown)
    assert expected in shown._repr_html_().replace("&#x27;", "'").replace("&#39;", "'")


def swaps_the_tracer_and_back():
    a = torch.empty(256, 1024)
    old = sys.gettrace()
    sys.settrace(None)
    b = torch.empty(512, 1024)
    sys.settrace(old)
    c = torch.empty(1024, 1024)
    return a, b, c


def make_one():
    t = torch.empty(256, 1024)
    return t


def calls_swapper():
    x = swaps_the_tracer_and_back()
    y = make_one()  # a new frame: the tracer put back resumes profiling here
    return x, y


@needs_settrace
def test_putting_back_what_gettrace_gave_resumes_profiling():
    with LineProfiler(swaps_the_tracer_and_back, calls_swapper, make_one, device="cpu") as lp:
        calls_swapper()
    assert not ours(sys.gettrace())
    swap = by_line(lp, swaps_the_tracer_and_back)
    assert swap["b = torch.empty(512, 1024)"]["hits"] == 0
    assert by_line(lp, make_one)["t = torch.empty(256, 1024)"][
        "allocated_bytes.all.allocated"
    ] == MiB
    notices = lp.display().notices
    assert any("profiling stopped on thread" in n for n in notices)
    assert any("profiling resumed on thread" in n for n in notices)


# --- deleting an enabled profiler ---------------------------------------------------


def ours(tracer) -> bool:
    """Whether a sys.gettrace() value belongs to memlab_rs."""
    return "memlab_rs" in (getattr(tracer, "__module__", None) or type(tracer).__module__)


def test_deleting_an_enabled_profiler_removes_every_hook():
    before = sys.gettrace()
    assert not ours(before)
    lp = LineProfiler(work, device="cpu")
    lp.enable()
    del lp
    gc.collect()
    if MONITORING:
        assert our_tool_ids() == []
    else:
        assert sys.gettrace() is before
    with LineProfiler(work, device="cpu") as lp:
        work()
    assert_work_profiled(lp)


def test_deleting_an_enabled_profiler_in_a_cycle_removes_every_hook():
    before = sys.gettrace()
    assert not ours(before)
    lp = LineProfiler(work, device="cpu")
    lp.cycle = lp  # freed only by the garbage collector
    lp.enable()
    del lp
    gc.collect()
    if MONITORING:
        assert our_tool_ids() == []
    else:
        assert sys.gettrace() is before


# --- the engine's table: a dropped profiler's slot is reused, never its events ----------


def first():
    x = 1
    return x


def second():
    y = 2
    return y


def third():
    z = 3
    return z


FUNCTIONS = (first, second, third)


def hits_of(lp, func):
    """{line: hits} of `func` in `lp`'s report (empty when it never ran while enabled)."""
    return {r["line"]: r["hits"] for r in lp.display(func, COLUMNS).records()}


def test_a_profiler_made_per_step_reuses_one_slot():
    gc.collect()
    slots_before, alive_before = _core.line_profiler._line_engine_table()
    # 50 steps: a slot reused 49 times. Each enable walks the heap once for the CPU
    # source's baseline (late in a suite, ~35 ms on 3.13), so 300 took 11 s there.
    for _ in range(50):
        with LineProfiler(work, device="cpu") as lp:
            work()
    assert_work_profiled(lp)
    del lp
    slots, alive = _core.line_profiler._line_engine_table()
    assert alive == alive_before
    # Two alive at once at most: a step's profiler is made before the last one is dropped.
    assert slots <= max(slots_before, alive_before + 2), (slots_before, slots)


# What a sequence does: make a profiler of function k, enable/disable/drop the i-th alive
# one (drop_busy: dropped while the engine is held, so its retirement is queued), or call
# function k.
STEPS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["new", "call"]), st.integers(0, 2)),
        st.tuples(st.sampled_from(["enable", "disable", "drop", "drop_busy"]), st.integers(0, 9)),
    ),
    max_size=40,
)


@settings(
    max_examples=int(40 * float(os.environ.get("MEMLAB_RS_FUZZ_SCALE", "1"))),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(STEPS)
def test_dropped_profilers_slots_are_reused_and_their_events_reach_no_one_else(
    garbage_collected_once, steps
):
    slots_before, alive_before = _core.line_profiler._line_engine_table()
    alive: list[list] = []  # [profiler, function index, calls it saw while enabled]
    most = 0
    lp = None
    for what, n in steps:
        if what == "new":
            alive.append([LineProfiler(FUNCTIONS[n], device="cpu"), n, 0])
        elif what == "call":
            FUNCTIONS[n]()
            for i in range(len(alive)):
                alive[i][2] += alive[i][1] == n and alive[i][0].enabled
        elif alive:
            at = n % len(alive)
            if what == "enable":
                alive[at][0].enable()
            elif what == "disable":
                alive[at][0].disable()
            elif what == "drop":
                del alive[at]
            else:
                held = [alive.pop(at)]
                # its collector's drop is queued
                _core.line_profiler._run_inside_engine(held.clear)
        most = max(most, len(alive))
    for lp, k, calls in alive:
        lp.disable()
        func = FUNCTIONS[k]
        body = func.__code__.co_firstlineno + 1
        # Exactly the calls made while it was enabled: none of a dropped profiler's.
        assert hits_of(lp, func).get(body, 0) == calls
        assert [c.co_name for c in lp._collector.codes()] == [func.__name__]
    del alive, lp
    slots, alive_after = _core.line_profiler._line_engine_table()
    assert alive_after == alive_before
    assert slots <= max(slots_before, alive_before + most), (slots_before, slots, most)


# --- the engine: re-entry and other threads -----------------------------------------


def test_reentering_the_profiler_from_inside_it_is_a_clear_error():
    from memlab_rs import _core

    lp = LineProfiler(work, device="cpu")
    seen = []

    def inside():
        try:
            seen.append(lp.enabled)
        except RuntimeError as error:
            seen.append(str(error))

    _core.line_profiler._run_inside_engine(inside)
    assert len(seen) == 1 and "busy on this thread" in seen[0]
    assert lp.enabled is False


def test_events_dropped_while_busy_are_reported():
    from memlab_rs import _core

    with LineProfiler(work, device="cpu") as lp:
        work()
        # every event of this call finds the engine busy
        _core.line_profiler._run_inside_engine(work)
    shown = lp.display(work, COLUMNS)
    assert any(re.match(r"\d+ interpreter events were dropped", n) for n in shown.notices)
    assert "interpreter events were dropped" in str(shown)
    assert "interpreter events were dropped" in shown._repr_html_()
    assert shown.to_dataframe().attrs["notices"] == shown.notices
    assert by_line(lp, work)["a = torch.empty(256, 1024)"]["hits"] == 1


def test_no_notice_keeps_pytorch_memlabs_text():
    with LineProfiler(work, device="cpu") as lp:
        work()
    shown = lp.display(work, COLUMNS)
    assert shown.notices == []
    text = str(shown)
    assert "Notes" not in text
    assert text.rstrip().endswith("return a, b") and text.endswith("\n")
