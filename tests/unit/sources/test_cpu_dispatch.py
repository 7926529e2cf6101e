"""The CPU source's dispatch-mode fallback (forced with MEMLAB_RS_CPU_SOURCE=dispatch): it
counts only while profiling, leaves no mode behind on the calling thread, never stacks up on
a worker thread, never crashes the process, and every report made with it says so.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from memlab_rs import LineProfiler, _core
from memlab_rs._sources import cpu_dispatch as _cpu_dispatch

MiB = 1 << 20


@pytest.fixture(autouse=True)
def dispatch_fallback(monkeypatch):
    monkeypatch.setenv("MEMLAB_RS_CPU_SOURCE", "dispatch")


def stack_len() -> int:
    return torch._C._len_torch_dispatch_stack()


class Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def enters_a_mode(mode):
    mode.__enter__()
    x = torch.empty(256, 1024)
    return x


def test_disable_leaves_no_mode_on_the_calling_thread_even_when_not_innermost():
    mode = Passthrough()
    assert stack_len() == 0
    with LineProfiler(enters_a_mode, device="cpu") as lp:
        enters_a_mode(mode)  # returns with the user's mode above ours
    assert stack_len() == 1 and torch._C._get_dispatch_stack_at(0) is mode
    mode.__exit__(None, None, None)
    assert stack_len() == 0
    report = lp.display(columns=["allocated_bytes.all.allocated"])
    line = {r["code"].strip(): r for r in report.records()}["x = torch.empty(256, 1024)"]
    assert line["allocated_bytes.all.allocated"] == MiB
    assert lp.stats_reader is None  # disabled: no source
    (notice,) = [n for n in report.notices if "dispatch-mode fallback" in n]
    assert "MEMLAB_RS_CPU_SOURCE=dispatch" in notice and "misses out=" in notice


def loops_until_told(state):
    state["stack"] = stack_len()
    state["inside"].set()
    while not state["stop"]:
        if state["allocate"]:
            state["kept"].append(torch.empty(1024, 1024))
            state["allocate"] = False
            state["stack"] = stack_len()
            state["allocated"].set()
        time.sleep(0.001)


def test_a_worker_stops_counting_at_disable_and_counts_again_after_enable():
    state = {"stop": False, "allocate": False, "kept": [], "inside": threading.Event(),
             "allocated": threading.Event()}

    def allocate_on_worker():
        state["allocated"].clear()
        state["allocate"] = True
        assert state["allocated"].wait(30)

    lp = LineProfiler(loops_until_told, device="cpu")
    lp.enable()
    thread = threading.Thread(target=loops_until_told, args=(state,))
    thread.start()
    try:
        assert state["inside"].wait(30)
        allocate_on_worker()
        assert state["stack"] == 1  # our mode, on the worker
        lp.disable()  # from another thread, while the worker is inside the function
        assert stack_len() == 0
        live = _core._cpu_live()
        allocate_on_worker()
        assert _core._cpu_live() == live, "a storage was counted after disable()"
        lp.enable()
        allocate_on_worker()
        assert state["stack"] == 1, "modes from an earlier enable() stacked up"
        assert _core._cpu_live()[0] >= live[0] + 4 * MiB
    finally:
        state["stop"] = True
        thread.join(30)
        lp.disable()
    allocated = {r["code"].strip(): r for r in lp.display(columns=["allocated_bytes.all.allocated"])
                 .records()}["state[\"kept\"].append(torch.empty(1024, 1024))"]
    assert allocated["allocated_bytes.all.allocated"] == 4 * MiB


def test_a_worker_that_ends_after_disable_pops_its_own_mode():
    state = {"stop": False, "allocate": False, "kept": [], "inside": threading.Event(),
             "allocated": threading.Event()}
    popped = []
    lp = LineProfiler(loops_until_told, device="cpu")

    def run():
        loops_until_told(state)
        popped.append(stack_len())  # still on the worker: the retired mode is still there

    with lp:
        thread = threading.Thread(target=run)
        thread.start()
        assert state["inside"].wait(30)
    state["stop"] = True
    thread.join(30)
    assert popped == [1]
    # The thread is gone: its record was finalised on it, which popped the mode.
    assert _cpu_dispatch._retired_modes_alive() == 0


def test_a_hook_error_is_reported_with_the_first_message(monkeypatch):
    def broken():
        raise RuntimeError("adoption failed for the test")

    monkeypatch.setattr(_cpu_dispatch, "_adopt_existing", broken)
    user = Passthrough()
    with LineProfiler(enters_a_mode, device="cpu") as lp:
        enters_a_mode(user)
    # Leave the user's mode as users do (torch 2.8's _pop_torch_dispatch_stack(None)
    # crashes on a mode that __enter__ pushed).
    user.__exit__(None, None, None)
    assert stack_len() == 0
    notices = lp.display().notices
    assert any("error" in n and "adoption failed for the test" in n for n in notices), notices
