"""The dispatch-mode CPU source (MEMLAB_RS_CPU_SOURCE=dispatch) in whole processes: threads
running inside profiled code while the profiler is disabled and enabled again never crash
the interpreter (each scenario runs in fresh interpreters, several rounds each). Moved from
tests/unit/sources/test_cpu_dispatch.py: they start interpreters."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

# Two threads run a profiled function in a loop; the scripts differ in how profiling ends.
# Each script plays its scenario ROUNDS times in one interpreter (a crash ends the process
# with a signal, whichever round it hits), so the test pays torch's import twice, not ten
# times.
ROUNDS = 5

CRASH_PREAMBLE = """
    import threading, time, torch
    from memlab_rs import LineProfiler

    def work():
        a = torch.empty(64, 64)
        b = a * 2
        return b

    stop = threading.Event()

    def loop():
        while not stop.is_set():
            work()
"""

CRASH_BLOCK = CRASH_PREAMBLE + """
    def scenario():
        stop.clear()
        with LineProfiler(work, device="cpu"):
            threads = [threading.Thread(target=loop) for _ in range(2)]
            for t in threads:
                t.start()
            time.sleep(0.2)
        time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join()
"""

CRASH_TOGGLE = CRASH_PREAMBLE + """
    def scenario():
        stop.clear()
        lp = LineProfiler(work, device="cpu")
        lp.enable()
        threads = [threading.Thread(target=loop) for _ in range(2)]
        for t in threads:
            t.start()
        end = time.time() + 0.6
        while time.time() < end:
            time.sleep(0.02)
            lp.disable()
            time.sleep(0.02)
            lp.enable()
        lp.disable()
        time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join()
"""


def exit_codes(source: str, runs: int) -> list[int]:
    """Run ``source``'s scenario ``ROUNDS`` times in each of ``runs`` interpreters, two at a
    time, and return their exit codes."""
    script = textwrap.dedent(source) + f"\nfor _ in range({ROUNDS}):\n    scenario()\n"
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "script.py")
        with open(path, "w") as f:
            f.write(script)
        codes: list[int] = []
        for start in range(0, runs, 2):
            procs = [
                subprocess.Popen([sys.executable, path], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL,
                                 env={**os.environ, "MEMLAB_RS_CPU_SOURCE": "dispatch"})
                for _ in range(min(2, runs - start))
            ]
            codes += [p.wait(timeout=120) for p in procs]
    return codes


@pytest.mark.parametrize("source", [CRASH_BLOCK, CRASH_TOGGLE], ids=["block", "toggle"])
def test_threads_inside_profiled_code_at_disable_never_crash_the_process(source):
    codes = exit_codes(source, 2)
    assert codes == [0] * len(codes)
