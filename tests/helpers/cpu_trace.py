"""What the CPU trace's tests share (tests/unit/trace/test_trace_cpu_record.py in process,
tests/integration/test_trace_processes.py across fork): the lines a file marks with
``# LINE: name``, a recording's entries, its replay, and the check that nothing of the
recorder or the allocator hook is left installed."""

from __future__ import annotations

import gc
import re

import pytest

from memlab_rs import _core


def marked_lines(path: str) -> dict[str, int]:
    """The line of each ``# LINE: name`` marker of the file at ``path`` (so that the file can
    be edited freely)."""
    lines: dict[str, int] = {}
    with open(path) as source:
        for number, text in enumerate(source, 1):
            found = re.search(r"# LINE: (\w+)$", text)
            if found:
                assert found.group(1) not in lines, found.group(1)
                lines[found.group(1)] = number
    return lines


def entries(trace: dict) -> list[dict]:
    (device,) = trace["device_traces"]
    return device


def at(trace: dict, address: int) -> list[tuple[str, int]]:
    """(action, size) of every entry at ``address``, in order."""
    return [(e["action"], e["size"]) for e in entries(trace) if e["addr"] == address]


def alloc_at(trace: dict, address: int) -> dict:
    """The latest allocation at ``address`` (an address freed during the trace, by another
    thread say, can be allocated again)."""
    found = [e for e in entries(trace) if e["addr"] == address and e["action"] == "alloc"]
    assert found, f"no allocation at {address:#x}"
    return found[-1]


def hook_slots_ours() -> list[bool]:
    return [ours for _name, _relro, ours in _core._cpu_hook_slots()]


def assert_nothing_installed() -> None:
    assert not _core._cpu_trace_active()
    assert _core._cpu_mode() is None
    slots = hook_slots_ours()
    assert slots and not any(slots), _core._cpu_hook_slots()


@pytest.fixture(autouse=True)
def no_trace_left():
    """Autouse in the modules that import it: no garbage of an earlier test is freed in the
    middle of a test, and a test that leaves a CPU trace running fails."""
    gc.collect()
    yield
    if _core._cpu_trace_active():
        _core._cpu_trace_stop()
        pytest.fail("the test left a CPU trace running")


def replay(trace: dict) -> dict[int, int]:
    """start.live plus every entry, in order: the allocations alive at the stop. Checks
    each entry against what was alive (an alloc at a free address, a free of a live one)."""
    live = dict(map(tuple, trace["memlab_rs"]["start"]["live"]))
    last = trace["memlab_rs"]["start"]["time_us"]
    for e in entries(trace):
        assert e["time_us"] >= last
        last = e["time_us"]
        if e["action"] == "alloc":
            assert e["addr"] not in live, e
            live[e["addr"]] = e["size"]
        elif e["action"] == "free_requested":
            assert live[e["addr"]] == e["size"], e
        else:
            assert e["action"] == "free_completed"
            assert live.pop(e["addr"]) == e["size"], e
    return live
