"""The line profiler where a test needs a process of its own and the interpreter's behaviour
matters (noxfile.py runs this file on the oldest and the newest CPython): the global
profiler printing at exit and after KeyboardInterrupt, a fork while profiling, an enable
that fails (an audit hook stays for good), the thread-state fallback chosen at the first
enable, and the engine waited for from another thread. Each runs a script in a fresh
interpreter (`script`). The global profiler's other behaviours, in processes of their own,
are test_global_profiler_processes.py's."""

from __future__ import annotations

import sys
import textwrap

import pytest

MiB = 1 << 20
MONITORING = sys.version_info >= (3, 12)
needs_settrace = pytest.mark.skipif(
    MONITORING, reason="on 3.12+ the profiler uses sys.monitoring and leaves sys.settrace alone"
)


# --- the global profiler at interpreter exit and on KeyboardInterrupt ----------------


def test_profile_prints_at_exit(script):
    out = script(
        """
        import torch
        from memlab_rs import profile

        DEV = "cuda" if torch.cuda.is_available() else "cpu"

        @profile
        def step():
            x = torch.empty(256, 1024, device=DEV)
            return x

        @profile(columns=("allocated_bytes.all.allocated",))
        def other():
            y = torch.empty(512, 1024, device=DEV)
            return y

        step(); other()
        """
    )
    assert out.index("## step") < out.index("## other")
    assert "x = torch.empty(256, 1024, device=DEV)" in out
    assert "2.00M" in out.split("## other")[1]


def test_profile_prints_after_keyboard_interrupt(script):
    out = script(
        """
        import torch
        from memlab_rs import profile

        @profile
        def step():
            x = torch.empty(256, 1024)
            raise KeyboardInterrupt

        step()
        """,
        check=False,
    )
    assert "## step" in out
    assert "x = torch.empty(256, 1024)" in out


# --- hooks and the engine ------------------------------------------------------------


def test_an_enable_that_fails_leaves_no_recording_behind(script):
    # The hooks cannot be installed: on 3.12+ both tool ids are taken, below an audit hook
    # refuses sys.settrace (audit hooks stay for good: a process of its own).
    out = script(
        """
        import sys, torch
        from memlab_rs import LineProfiler, _core, trace

        def work():
            a = torch.empty(256, 1024)
            b = torch.empty(512, 1024)
            return a, b

        refuse = True
        if sys.version_info >= (3, 12):
            sys.monitoring.use_tool_id(3, "tool three")
            sys.monitoring.use_tool_id(4, "tool four")
        else:
            def audit(event, args):
                if event == "sys.settrace" and refuse:
                    raise RuntimeError("sys.settrace refused by an audit hook")
            sys.addaudithook(audit)
        lp = LineProfiler(work, device="cpu", peak_live=True)
        try:
            lp.enable()
        except RuntimeError as error:
            print("enable failed:", error)
        print("enabled", lp.enabled, "recording", _core._cpu_trace_active())
        refuse = False
        if sys.version_info >= (3, 12):
            sys.monitoring.free_tool_id(3)
            sys.monitoring.free_tool_id(4)
        with trace.Tracer(device="cpu") as tr:  # the next recording starts
            x = torch.empty(256, 1024)
        print("traced", tr.result.max_mem("cpu") >= 1 << 20)
        with lp:
            kept = work()
        rows = {r["code"].strip(): r for r in lp.display(work, ["peak_live"]).records()}
        print("peak_live", rows["b = torch.empty(512, 1024)"]["peak_live"])
        """
    )
    assert "enable failed:" in out, out
    assert "enabled False recording False" in out, out
    assert "traced True" in out, out
    assert f"peak_live {2 * MiB}" in out, out


@needs_settrace
def test_without_a_readable_thread_state_only_tracer_free_threads_are_profiled(script):
    out = script(
        """
        import os, sys, threading, torch
        from memlab_rs import LineProfiler

        def work():
            a = torch.empty(256, 1024)
            return a

        def tracer(frame, event, arg):
            return None

        ready, go, done = threading.Event(), threading.Event(), threading.Event()
        seen = {}

        def worker():
            sys.settrace(tracer)
            ready.set()
            go.wait(30)
            work()
            seen["during"] = sys.gettrace() is tracer
            done.set()

        thread = threading.Thread(target=worker)
        thread.start()
        ready.wait(30)
        with LineProfiler(work, device="cpu") as lp:
            work()
            go.set()
            done.wait(30)
        thread.join()
        line = {r["code"].strip(): r for r in lp.display().records()}["a = torch.empty(256, 1024)"]
        print("hits", line["hits"], "worker kept", seen["during"], "gettrace", sys.gettrace())
        print("notes", lp.display().notices)
        """,
        env={"MEMLAB_RS_THREAD_STATE": "official"},
    )
    assert "hits 1 worker kept True gettrace None" in out, out
    assert "other threads' tracers cannot be read here" in out, out


def joined(*parts: str) -> str:
    """One script from parts indented differently."""
    return "".join(textwrap.dedent(part) for part in parts)


FORK_CHILD_CHECKS = """
    def hooks_of_ours():
        if sys.version_info >= (3, 12):
            return [i for i in range(6) if sys.monitoring.get_tool(i) == "memlab_rs"]
        return sys.gettrace()

    def child_checks(lp):
        assert not lp.enabled, "the child inherited an enabled profiler"
        assert not hooks_of_ours(), hooks_of_ours()
        assert torch._C._len_torch_dispatch_stack() == 0
        work()  # runs unprofiled, at full speed
        before = lp.display(work, COLS).records()
        assert [r["hits"] for r in before] == [r["hits"] for r in lp.display(work, COLS).records()]
        with lp:  # the child may ask to be profiled
            work()
"""


# What both fork tests' scripts start with: the profiled work and the child's checks.
FORK_PREAMBLE = joined(
    """
    import sys, torch
    from memlab_rs import LineProfiler

    COLS = ("allocated_bytes.all.allocated",)

    def work():
        a = torch.empty(256, 1024)
        b = torch.empty(512, 1024)
        return a, b
    """,
    FORK_CHILD_CHECKS,
)


@pytest.mark.skipif(sys.platform == "win32", reason="fork")
def test_a_child_forked_while_profiling_starts_clean(script):
    out = script(joined(
        """
        import os
        """,
        FORK_PREAMBLE,
        """
        def profiled_fork():
            x = torch.empty(1024, 1024)
            pid = os.fork()
            if pid == 0:
                try:
                    child_checks(lp)
                except BaseException as error:
                    print("child failed:", repr(error), flush=True)
                    os._exit(1)
                os._exit(0)
            y = torch.empty(256, 1024)
            return pid, x, y

        lp = LineProfiler(work, profiled_fork, device="cpu")
        with lp:
            pid, *_ = profiled_fork()
            work()
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status))
        lines = {r["code"].strip(): r for r in lp.display(None, COLS).records()}
        print("x", lines["x = torch.empty(1024, 1024)"]["allocated_bytes.all.allocated"])
        print("y", lines["y = torch.empty(256, 1024)"]["allocated_bytes.all.allocated"])
        print("b", lines["b = torch.empty(512, 1024)"]["allocated_bytes.all.allocated"])
        """,
    ))
    assert "child exit 0" in out, out
    assert f"x {4 * MiB}" in out and f"y {MiB}" in out and f"b {2 * MiB}" in out


@pytest.mark.skipif(sys.platform == "win32", reason="fork")
def test_a_multiprocessing_fork_child_starts_clean(script):
    out = script(joined(
        """
        import multiprocessing
        """,
        FORK_PREAMBLE,
        """
        def target():
            child_checks(lp)

        lp = LineProfiler(work, device="cpu")
        with lp:
            work()
            process = multiprocessing.get_context("fork").Process(target=target)
            process.start()
            process.join(60)
            work()
        print("child exit", process.exitcode)
        lines = {r["code"].strip(): r for r in lp.display(work, COLS).records()}
        print("hits", lines["b = torch.empty(512, 1024)"]["hits"])
        """,
    ))
    assert "child exit 0" in out, out
    assert "hits 2" in out


def test_waiting_for_another_threads_engine_releases_the_gil(script):
    out = script(
        """
        import threading, time
        from memlab_rs import LineProfiler, _core

        lp = LineProfiler(device="cpu")
        inside = threading.Event()

        def hold():
            def slow():
                inside.set()
                t = time.perf_counter()
                while time.perf_counter() - t < 0.3:  # Python code: needs the GIL back
                    pass
            _core.line_profiler._run_inside_engine(slow)
            print("held", flush=True)

        thread = threading.Thread(target=hold)
        thread.start()
        inside.wait(10)
        enabled = lp.enabled  # waits for the engine, with the GIL released
        print(f"enabled {enabled}", flush=True)
        thread.join()
        print("done")
        """,
        timeout=60,
    )
    assert "held" in out and "enabled False" in out and "done" in out




def test_a_good_revalidation_setting_is_taken_and_initialises_nothing(script):
    # A fresh interpreter: whether CUDA is up must not depend on the tests run before.
    out = script(
        """
        import os, torch
        os.environ["MEMLAB_RS_CUDA_REVALIDATE_SAMPLES"] = "64"
        from memlab_rs import _core
        collector = _core.line_profiler.LineCollector("cuda:0")
        collector.enable()
        try:
            assert collector.enabled
            assert collector.stats_reader == "torch._C._cuda_memoryStats"
            assert not torch.cuda.is_initialized()
        finally:
            collector.disable()
        assert collector.stats_reader is None
        print("ok")
        """
    )
    assert out.strip() == "ok"
