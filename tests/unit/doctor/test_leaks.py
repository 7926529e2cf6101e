"""The leak check on CPU tensors, in-process: a list growing by a known number of bytes per
step is found at its line with exactly those bytes; a steady loop says nothing; the context
manager; nothing of ours stays installed afterwards, whether the steps return, raise or are
interrupted; bad arguments name themselves."""

from __future__ import annotations

import _thread
import inspect
import json
import os
import signal
import sys
import threading
import time

import pytest
import torch
from cpu_trace import assert_nothing_installed, no_trace_left  # noqa: F401  (autouse)
from interrupt_at_line import InterruptAtLine, interrupt_at_each_line

import memlab_rs
from memlab_rs import LeakResult, _core

HERE = os.path.basename(__file__)


def line_of(function, text: str) -> int:
    """The line of ``function`` holding ``text``."""
    lines, first = inspect.getsourcelines(function)
    (offset,) = [i for i, line in enumerate(lines) if text in line]
    return first + offset


KEPT: list[torch.Tensor] = []


def leaking_step():
    KEPT.append(torch.empty(3000, dtype=torch.uint8))  # the leak: 3,000 bytes a step
    scratch = torch.ones(2048) * 3  # temporaries, freed in the step
    return float(scratch.sum())


def test_a_list_growing_by_known_bytes_is_found_at_its_line():
    KEPT.clear()
    result = memlab_rs.leaks(leaking_step, steps=5, warmup=2, device="cpu")
    line = line_of(leaking_step, "KEPT.append")
    (site,) = result.sites("cpu")
    assert site["location"].endswith(f"{HERE}:{line} (leaking_step)"), site
    assert site["bytes_per_step"] == 3000.0
    # warm-up's two are alive too: 3 at the end of the first measured step
    assert site["live_bytes"] == [9000, 12000, 15000, 18000, 21000]
    assert site["allocations"] == len(KEPT) == 7
    assert result.leaking and result.steps == 5 and result.warmup == 2
    text = result.text()
    assert f"+3,000 bytes/step  {site['location']}" in text
    assert_nothing_installed()
    KEPT.clear()


def test_a_steady_loop_says_nothing():
    state = {}

    def steady_step():
        previous = state.get("out")
        state["out"] = torch.randn(512) + (0 if previous is None else previous[:1])
        return state["out"].sum()

    result = memlab_rs.leaks(steady_step, steps=6, warmup=1, device="cpu")
    assert result.sites() == []
    assert not result.leaking
    assert "no site grew at every step" in result.text()
    assert_nothing_installed()


def test_several_sites_fastest_first_and_a_shrinking_one_left_out():
    a, b, window = [], [], []

    def step():
        a.append(torch.empty(100, dtype=torch.uint8))
        b.append(torch.empty(4096, dtype=torch.uint8))
        window.append(torch.empty(64, dtype=torch.uint8))  # a window of 2: steady
        del window[:-2]

    result = memlab_rs.leaks(step, steps=4, warmup=2, device="cpu")
    sites = result.sites("cpu")
    assert [s["bytes_per_step"] for s in sites] == [4096.0, 100.0]
    assert [s["location"].rsplit(":", 1)[1] for s in sites] == [
        f"{line_of(step, 'b.append')} (step)",
        f"{line_of(step, 'a.append')} (step)",
    ]


def test_the_context_manager_measures_a_loop_that_is_not_one_function():
    kept = []
    with memlab_rs.leak_check(warmup=1, device="cpu") as check:
        for _ in range(5):
            kept.append(torch.zeros(128, dtype=torch.float64))  # 1,024 bytes
            check.step()
        torch.empty(10**6)  # after the last step(): not a step's
    (site,) = check.result.sites("cpu")
    assert site["bytes_per_step"] == 1024.0
    assert site["live_bytes"] == [2048, 3072, 4096, 5120]
    assert check.result.steps == 4
    assert_nothing_installed()


def test_steps_end_the_recording_and_later_steps_do_nothing():
    kept = []
    check = memlab_rs.leak_check(steps=3, warmup=0, device="cpu").start()
    for _ in range(6):
        kept.append(torch.empty(10, dtype=torch.uint8))
        check.step()
        if check.result is not None:
            assert_nothing_installed()
    assert check.stop() is check.result
    assert check.result.sites("cpu")[0]["live_bytes"] == [10, 20, 30]


def test_too_few_steps_is_an_error_that_says_how_many():
    with pytest.raises(RuntimeError, match=r"saw 2 step\(\) call\(s\) with warmup=1"):
        with memlab_rs.leak_check(warmup=1, device="cpu") as check:
            check.step()
            check.step()
    assert_nothing_installed()


def test_a_step_that_raises_leaves_nothing_installed():
    def broken():
        torch.empty(100)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        memlab_rs.leaks(broken, device="cpu")
    assert_nothing_installed()
    with pytest.raises(ZeroDivisionError):
        with memlab_rs.leak_check(device="cpu") as check:
            check.step()
            raise ZeroDivisionError
    assert_nothing_installed()
    assert check.result is None


def test_a_keyboard_interrupt_inside_the_steps_leaves_nothing_installed():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    kept = []

    def busy():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            kept.append(torch.empty(64, dtype=torch.uint8))
            if len(kept) > 100:
                kept.clear()

    try:
        timer = threading.Timer(0.05, _thread.interrupt_main)
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            memlab_rs.leaks(busy, device="cpu")
        timer.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert_nothing_installed()


def test_an_interrupt_at_any_line_of_the_check_leaves_nothing_installed():
    modules = ("growth.py", "_leak_recording.py")

    def run(tracer: InterruptAtLine) -> None:
        def step():
            KEPT.append(torch.empty(100, dtype=torch.uint8))

        sys.settrace(tracer)
        try:
            memlab_rs.leaks(step, steps=2, warmup=1, device="cpu")
        finally:
            sys.settrace(None)
            KEPT.clear()

    tried = interrupt_at_each_line(run, modules, _core._cpu_trace_active, assert_nothing_installed)
    assert tried > 40


def test_a_running_cpu_trace_is_named_and_left_running():
    _core._cpu_trace_start(1000)
    try:
        with pytest.raises(RuntimeError, match="cannot record CPU tensors: a CPU trace"):
            memlab_rs.leaks(leaking_step, device="cpu")
        assert _core._cpu_trace_active()
    finally:
        _core._cpu_trace_stop()
    assert_nothing_installed()


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: memlab_rs.leaks(42), TypeError, "step_fn must be a function"),
        (lambda: memlab_rs.leaks(leaking_step, steps=1), ValueError, "steps must be an int >= 2"),
        (lambda: memlab_rs.leaks(leaking_step, warmup=-1), ValueError, "warmup must be an int"),
        (lambda: memlab_rs.leak_check(steps="5"), TypeError, "steps must be an int >= 2"),
        (lambda: memlab_rs.leak_check(device="meta"), ValueError, "device='meta'"),
        (lambda: memlab_rs.leak_check(max_entries=0), ValueError, "max_entries must be"),
    ],
)
def test_bad_arguments_name_the_parameter(call, error, message):
    with pytest.raises(error, match=message):
        call()
    assert_nothing_installed()


def test_a_result_saves_and_loads_back(tmp_path):
    KEPT.clear()
    result = memlab_rs.leaks(leaking_step, steps=3, device="cpu")
    path = tmp_path / "leaks.json"
    result.save(path)
    loaded = memlab_rs.load(path)
    assert isinstance(loaded, LeakResult)
    assert loaded.text() == result.text()
    assert loaded.to_data() == result.to_data()
    KEPT.clear()


def test_a_damaged_result_names_the_field():
    data = {"warmup": 1, "steps": 3, "devices": [{"device": "cpu", "sites": [], "outlived": -1}]}
    with pytest.raises(ValueError, match="outlived"):
        LeakResult.from_data(data, {})


def test_the_analysis_refuses_what_it_cannot_read():
    recording = {"warmup": 0, "steps": 2, "devices": [
        {"device": "cpu", "allocations": [[None, 10, 1, 0]]}]}  # fmt: skip
    with pytest.raises(ValueError, match=r"allocation 0: freed in step 0, before"):
        _core.doctor.leaks_analyse(json.dumps(recording))
