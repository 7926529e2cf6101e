"""The out-of-memory post-mortem on CPU, in process: a real allocation torch's CPU allocator
refuses, explained where it happened, the error unchanged; the guard's install and uninstall
leaving nothing behind; a failure of the guard never replacing the user's error; and the
advice's analysis checked over random allocator layouts against its definition."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import memlab_rs
from memlab_rs import _core
from memlab_rs.doctor import guard as guard_module

MiB = 1 << 20
HUGE = 1 << 60  # no machine has it: torch's CPU allocator refuses at once


def make_too_much() -> torch.Tensor:
    return torch.empty(HUGE, dtype=torch.uint8)  # the failing line


def test_a_cpu_allocation_refused_is_explained_where_it_happened(tmp_path: Path):
    model = torch.nn.Linear(256, 128)
    hidden = model(torch.randn(32, 256))
    with pytest.raises(RuntimeError, match="DefaultCPUAllocator") as caught:
        with memlab_rs.oom_guard(dir=tmp_path, summary=False) as guard:
            make_too_much()
    assert f"{HUGE} bytes" in str(caught.value)  # the user's error, unchanged
    pm = guard.last
    assert pm is not None and guard.path is not None
    data = pm.to_data()
    assert data["device"] == "cpu"
    assert data["request"]["bytes"] == HUGE
    assert data["stack"][-1]["function"] == "make_too_much"
    assert data["stack"][-1]["line"] == make_too_much.__code__.co_firstlineno + 1
    names = {t["name"]: t["bytes"] for t in data["tensors"]}
    assert names["model.weight"] == 256 * 128 * 4 and names["model.bias"] == 128 * 4
    # autograd keeps the input of the linear layer for backward: 32 x 256 floats
    assert data["autograd"]["saved_bytes"] == 32 * 256 * 4
    assert "activations" in pm.advice_kinds()
    assert data["host"]["available"] > 0
    loaded = memlab_rs.load(guard.path)
    assert loaded.to_data() == data and loaded.text() == pm.text()
    assert "Out of memory on cpu" in pm.text()
    assert pm.render("html").startswith('<div class="memlab-postmortem">')
    assert json.loads(pm.render("json")) == data
    del hidden


def test_the_summary_goes_to_stderr_and_names_the_file(tmp_path: Path, capsys):
    with pytest.raises(RuntimeError):
        with memlab_rs.oom_guard(dir=tmp_path):
            make_too_much()
    err = capsys.readouterr().err
    assert "Out of memory on cpu" in err
    assert f"{HUGE:,} B" in err
    assert "post-mortem: " in err and str(tmp_path) in err


def test_as_a_decorator_it_explains_and_lets_the_error_through(tmp_path: Path):
    @memlab_rs.oom_guard(dir=tmp_path, summary=False)
    def step() -> None:
        make_too_much()

    with pytest.raises(RuntimeError, match="DefaultCPUAllocator"):
        step()
    assert len(list(tmp_path.glob("memlab_oom_*.json"))) == 1


def test_other_errors_are_left_alone(tmp_path: Path):
    with pytest.raises(ZeroDivisionError):
        with memlab_rs.oom_guard(dir=tmp_path, summary=False) as guard:
            1 / 0  # noqa: B018
    assert guard.last is None and list(tmp_path.iterdir()) == []


def test_a_guard_that_fails_never_replaces_the_users_error(tmp_path: Path, capsys):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    with pytest.raises(RuntimeError, match="DefaultCPUAllocator"):
        with memlab_rs.oom_guard(dir=blocker / "sub", summary=False):
            make_too_much()
    assert "post-mortem failed" in capsys.readouterr().err
    assert guard_module._ACTIVE == []


def test_install_and_uninstall_leave_nothing_behind(tmp_path: Path):
    hooks = (sys.excepthook, threading.excepthook)
    guard = memlab_rs.oom_guard.install(dir=tmp_path, summary=False)
    assert guard_module._ACTIVE == [guard]
    with pytest.raises(RuntimeError, match="already installed"):
        memlab_rs.oom_guard.install()
    try:
        make_too_much()
    except RuntimeError as error:  # uncaught errors reach the hook; call it as Python would
        sys.excepthook(type(error), error, error.__traceback__)
    assert guard.last is not None and guard.last.to_data()["request"]["bytes"] == HUGE
    memlab_rs.oom_guard.uninstall()
    assert (sys.excepthook, threading.excepthook) == hooks
    assert guard_module._ACTIVE == [] and guard_module._INSTALLED == {}
    memlab_rs.oom_guard.uninstall()  # twice is harmless


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_thread_that_runs_out_is_explained_through_threading_excepthook(tmp_path: Path):
    memlab_rs.oom_guard.install(dir=tmp_path, summary=False)
    try:
        worker = threading.Thread(target=make_too_much)
        worker.start()
        worker.join()
    finally:
        memlab_rs.oom_guard.uninstall()
    assert len(list(tmp_path.glob("memlab_oom_*.json"))) == 1


def test_bad_arguments_name_the_parameter():
    with pytest.raises(TypeError, match="model="):
        memlab_rs.oom_guard(model=3)
    with pytest.raises(ValueError, match="batch_size"):
        memlab_rs.oom_guard(make_inputs=lambda b: b)
    with pytest.raises(ValueError, match="history"):
        memlab_rs.oom_guard(history=-1)


# -- the analysis ---------------------------------------------------------------------------


@st.composite
def layouts(draw):
    """Snapshot segments of the large pool on two streams, each a run of used and free
    blocks in 512-byte units, at 2 MiB-aligned addresses."""
    segments, address = [], 1 << 40
    for _ in range(draw(st.integers(1, 8))):
        blocks = draw(
            st.lists(st.tuples(st.booleans(), st.integers(1, 60_000)), min_size=1, max_size=6)
        )
        rows = [
            {"size": units * 512, "state": "inactive" if free else "active_allocated"}
            for free, units in blocks
        ]
        total = sum(b["size"] for b in rows)
        segments.append(
            {"address": address, "total_size": total, "stream": draw(st.sampled_from([0, 7])),
             "segment_type": "large", "blocks": rows}
        )  # fmt: skip
        address += -(-total // (2 * MiB)) * (2 * MiB)
    return segments


def facts_of(segments, request, driver_free):
    frag = memlab_rs.doctor.from_snapshot(
        segments, request=request, stream=0, device_free_bytes=driver_free
    )
    reserved = sum(s["total_size"] for s in segments)
    used = sum(b["size"] for s in segments for b in s["blocks"] if b["state"] != "inactive")
    return {
        "device": "cuda:0",
        "request": {"bytes": request, "allocation_bytes": None, "stream": 0,
                    "pool": "default", "source": "history"},
        "cuda": {"total": 80 << 30, "driver_free": driver_free, "reserved": reserved,
                 "allocated": used, "inactive_split": 0},
        "tensor_bytes": 0, "tensor_count": 0,
        "fragmentation": frag.to_data(),
    }  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(layouts(), st.integers(2 * MiB, 64 * MiB), st.integers(0, 64 * MiB))
def test_advice_follows_the_allocators_verdict_on_any_layout(segments, request, driver_free):
    """Fragmentation is named exactly when this stream's free bytes hold the request and no
    block does; expandable segments and max_split_size are advised exactly when the
    allocator floor's replay says they make it fit; the device is called full otherwise."""
    facts = facts_of(segments, request, driver_free)
    pm = json.loads(_core.doctor.postmortem_complete(json.dumps(facts)))
    verdict = pm["fragmentation"]["request"]
    kinds = [a["kind"] for a in pm["advice"]]
    mine = [b["size"] for s in segments if s["stream"] == 0 for b in s["blocks"]
            if b["state"] == "inactive"]  # fmt: skip
    free, largest = sum(mine), max(mine, default=0)
    rounded = verdict["rounded_bytes"]
    assert verdict["free_bytes"] == free and verdict["largest_free"] == largest
    assert ("fragmentation" in kinds) == (free >= rounded > largest)
    if "fragmentation" in kinds:
        assert next(a for a in pm["advice"] if a["kind"] == "fragmentation")["bytes"] == free
    expandable = verdict["expandable"]
    assert ("expandable_segments" in kinds) == (
        expandable is not None
        and expandable["outcome"] not in ("out_of_memory", "needs_device_memory")
    )
    full = verdict["configured"]["outcome"] == "out_of_memory" and not verdict["fragmented"]
    assert ("capacity" in kinds) == full


def test_a_damaged_post_mortem_names_the_field():
    broken = facts_of([], 1024, 0)
    broken["cuda"]["total"] = -1
    with pytest.raises(ValueError, match="cuda.total"):
        _core.doctor.postmortem_complete(json.dumps(broken))
    with pytest.raises(ValueError, match="request"):
        _core.doctor.postmortem_validate(json.dumps({"device": "cpu"}))
