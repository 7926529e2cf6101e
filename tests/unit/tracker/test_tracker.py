"""MemTracker on CPU, in this process: exact bytes, views once, grouping, names, the log's
layout (the golden log, written by a fresh interpreter: tests/integration/
test_tracker_processes.py)."""

from __future__ import annotations

import os
import re
import time

import pytest
import torch
from signal_alarms import alarms_into, spread
from tracker_readme import (
    PARAMETER,
    README_BLOCKS,
    cuda_blocks,
    numel,
    parameter_groups,
    vgg19_features,
)

import memlab_rs
from memlab_rs import MemTracker, TrackResult, TrackRow


def _log(tracker: MemTracker) -> str:
    with open(tracker.gpu_profile_fn) as f:
        return f.read()


def test_exact_bytes_views_once_and_grouping(tmp_path):
    tracker = MemTracker(path=f"{tmp_path}/", device="cpu")
    tracker.track()
    a = torch.zeros(40, 3, 8, 8)
    b = torch.ones(40, 3, 8, 8)
    view = a.view(-1)  # shares a's storage: no bytes of its own
    half = torch.zeros(10, dtype=torch.float16)
    result = tracker.track()
    rows = {(r.sign, r.shape, r.dtype): r for r in result.rows}
    assert rows["+", "(40, 3, 8, 8)", "torch.float32"].count == 2
    assert rows["+", "(40, 3, 8, 8)", "torch.float32"].bytes == 2 * 40 * 3 * 8 * 8 * 4
    assert rows["+", "(7680,)", "torch.float32"].bytes == 0
    assert rows["+", "(10,)", "torch.float16"].bytes == 20
    assert result.total_bytes - tracker_total_before(result, rows) >= 0
    del a, view
    result = tracker.track()
    rows = {(r.sign, r.shape): r for r in result.rows}
    assert rows["-", "(40, 3, 8, 8)"].count == 1
    assert rows["-", "(40, 3, 8, 8)"].bytes == 40 * 3 * 8 * 8 * 4
    assert rows["-", "(7680,)"].count == 1
    assert not any(r.sign == "+" for r in result.rows)
    # The whole group is not printed as - and + when only its count changes (the original does).
    assert len(result.rows) == 2
    del b, half
    assert tracker.track().rows  # what vanished is listed again


def tracker_total_before(result, rows):
    return sum(r.bytes for r in rows.values())


def test_a_view_found_before_its_base_is_not_charged_twice(tmp_path):
    tracker = MemTracker(path=f"{tmp_path}/", device="cpu")
    tracker.track()
    base = torch.zeros(1000)
    parts = [base[i * 100 : (i + 1) * 100] for i in range(10)]
    result = tracker.track()
    assert sum(r.bytes for r in result.rows if r.sign == "+") == 4000
    assert sum(r.count for r in result.rows if r.sign == "+") == 11
    del base, parts


def test_names_from_the_model_and_its_grads(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    tracker = MemTracker(path=f"{tmp_path}/", device="cpu", model=model)
    first = tracker.track()
    names = {n for r in first.rows for n in r.names}
    assert {"0.weight", "0.bias", "1.weight", "1.bias"} <= names
    assert all("Parameter" in r.type for r in first.rows if r.names)
    model(torch.ones(5, 4)).sum().backward()
    second = tracker.track()
    grads = {n for r in second.rows if r.sign == "+" for n in r.names}
    assert grads == {"0.weight.grad", "0.bias.grad", "1.weight.grad", "1.bias.grad"}
    assert sum(r.bytes for r in second.rows if r.names) == 4 * (12 + 3 + 6 + 2)


def test_log_file_name_header_and_returned_lines(tmp_path):
    tracker = MemTracker(path=f"{tmp_path}/run-", device="cpu")
    name = os.path.basename(tracker.gpu_profile_fn)
    assert re.fullmatch(r"run-\d\d-\w\w\w-\d\d-\d\d:\d\d:\d\d-gpu_mem_track\.txt", name)
    tracker.track()
    x = torch.zeros(120, 3, 16, 16)
    result = tracker.track()
    text = _log(tracker)
    assert text.startswith("GPU Memory Track | ")
    for row in result.rows:
        assert row.line + "\n" in text
    assert result.where.endswith(": test_log_file_name_header_and_returned_lines")
    assert f"line {result.where.split(' line ')[1]}" in text
    del x


def test_the_resuming_walk_serves_later_calls(tmp_path):
    tracker = MemTracker(path=f"{tmp_path}/", device="cpu")
    tracker.track()
    strategies = set()
    for _ in range(5):
        t = torch.zeros(3)
        strategies.add(tracker.track().strategy)
        del t
    if (3, 9) <= __import__("sys").version_info < (3, 14):
        assert "gc generation lists, since the last walk" in strategies


def test_track_from_a_finaliser_during_collection(tmp_path):
    tracker = MemTracker(path=f"{tmp_path}/", device="cpu")
    tracker.track()
    seen = []

    class Cycle:
        def __init__(self):
            self.me = self
            self.t = torch.zeros(7)

        def __del__(self):
            seen.append(tracker.track())

    Cycle()
    import gc

    gc.collect()
    assert seen and seen[0].incomplete and "garbage collection" in seen[0].incomplete
    assert "Note: " in _log(tracker)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"device": "cuda:0"}, RuntimeError, "device='cpu'"),
        ({"device": 0}, RuntimeError, "device='cpu'"),
        ({"device": -1}, ValueError, "CUDA device index is 0 or more"),
        ({"device": "tpu"}, ValueError, "not a device"),
        ({"device": 1.5}, TypeError, "device must be a torch.device"),
        ({"device": "meta"}, ValueError, "'cuda' or 'cpu'"),
        ({"path": 3}, TypeError, "path must be a str"),
        ({"model": "net"}, TypeError, "torch.nn.Module"),
    ],
)
def test_bad_input_errors(kwargs, error, match):
    if torch.cuda.is_available() and error is RuntimeError:
        pytest.skip("this machine has CUDA")
    with pytest.raises(error, match=match):
        MemTracker(**kwargs)


def test_no_reference_to_tensors_is_kept(tmp_path):
    import weakref

    tracker = MemTracker(path=f"{tmp_path}/", device="cpu")
    t = torch.zeros(5)
    tracker.track()
    ref = weakref.ref(t)
    del t
    assert ref() is None
    assert memlab_rs.MemTracker is MemTracker


def test_a_timeout_raised_by_a_signal_handler_during_track_reaches_the_caller(tmp_path):
    keep = [torch.empty(4) for _ in range(5_000)]
    tracker = MemTracker(path=str(tmp_path) + "/", device="cpu")
    start = time.perf_counter()
    tracker.track()
    raised, seen = alarms_into(tracker.track, spread(time.perf_counter() - start, 12))
    assert raised > 0 and seen == raised
    del keep


def _readme_result(blocks: bool) -> TrackResult:
    """The README's VGG-19 parameter rows as data: each storage's own bytes, and what the
    allocator holds for it (CUDA's 512-byte blocks when ``blocks``, else the same)."""
    rows = []
    for shape, count in parameter_groups().items():
        nbytes = numel(shape) * 4
        rows.append(
            TrackRow(
                sign="+",
                count=count,
                shape=str(shape),
                dtype="torch.float32",
                bytes=count * (cuda_blocks(nbytes) if blocks else nbytes),
                storage_bytes=count * nbytes,
                type=PARAMETER.split(" | ")[0],
            )
        )
    return TrackResult(
        rows=rows,
        total_bytes=sum(r.bytes for r in rows),
        total_storage_bytes=sum(r.storage_bytes for r in rows),
        allocated_bytes=sum(r.bytes for r in rows),
        tensors=sum(r.count for r in rows),
        where="main.py line 12: <module>",
        strategy="given",
        incomplete=None,
    )


@pytest.mark.parametrize("blocks", [True, False], ids=["cuda-blocks", "cpu"])
def test_rows_print_the_storages_bytes_as_the_original(blocks, tmp_path):
    # On CUDA the allocator rounds each storage up to 512 bytes: (64, 3, 3, 3) float32 is
    # 6912 bytes in 7168 of blocks, each (64,) 256 in 512. The log prints what the README
    # of the original prints (0.0065 M, 0.0004 M), whatever the blocks.
    result = _readme_result(blocks)
    text = result.text()
    assert {line for line in text.splitlines() if line.startswith("+")} == README_BLOCKS[0][0]
    assert "Total Tensor Used Memory:76.4   Mb" in text
    assert result.total_storage_bytes == 80_097_536
    assert result.total_bytes - result.total_storage_bytes == (768 if blocks else 0)
    # The data and the HTML keep both, and say which is which.
    first = next(r for r in result.rows if r.shape == "(64, 3, 3, 3)")
    assert (first.storage_bytes, first.bytes) == (6912, 7168 if blocks else 6912)
    html = result.html()
    assert "storage bytes" in html and "allocator bytes" in html and "512-byte blocks" in html
    assert ">6912</td><td style=\"text-align:right\">6.8 KiB</td>" in html
    assert f"<td style=\"text-align:right\">{first.bytes}</td><td>&lt;class" in html
    path = tmp_path / "track.json"
    result.save(path)
    loaded = memlab_rs.load(path)
    assert loaded == result and loaded.text() == text and loaded.html() == html


def test_vgg19_rows_on_the_cpu_are_the_originals(tmp_path):
    tracker = MemTracker(path=f"{tmp_path}/", device="cpu")
    before = tracker.track()
    model = vgg19_features()
    result = tracker.track()
    assert {r.line for r in result.rows} == README_BLOCKS[0][0]
    assert all(r.bytes == r.storage_bytes for r in result.rows)  # the CPU has no blocks
    assert result.total_storage_bytes - before.total_storage_bytes == 80_097_536
    assert result.total_bytes - before.total_bytes == 80_097_536
    del model
