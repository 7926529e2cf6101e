"""Saved results: the common file format (memlab_rs.results), with a line profile as the
result saved: where and when it was made (meta), plain JSON, and bad files as one clear
ValueError naming the file and the problem. (The line profile's own record, rendering and
damaged data: tests/unit/line_profiler/test_line_results.py.)"""

from __future__ import annotations

import json

import pytest
import torch

import memlab_rs
from memlab_rs import results

COLUMNS = ["allocated_bytes.all.allocated", "allocated_bytes.all.freed"]


def make_two():
    a = torch.empty(256, 1024)  # 1 MiB
    b = torch.empty(128, 1024)  # 512 KiB
    del a
    return b


def profiled():
    with memlab_rs.LineProfiler(make_two, device="cpu") as profiler:
        make_two()
    return profiler


def test_meta_says_where_and_when():
    meta = profiled().result().meta
    assert meta["device"] == "cpu"
    assert (meta["rank"], meta["world_size"]) == (0, 1)
    assert meta["memlab_rs"] == memlab_rs.__version__
    assert meta["torch"] == torch.__version__.split("+")[0]
    assert meta["created"].endswith("+00:00")
    assert isinstance(meta["pid"], int) and meta["argv"]


def test_meta_takes_the_rank_from_torchrun(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    meta = results.run_meta("cpu")
    assert (meta["rank"], meta["world_size"], meta["local_rank"]) == (3, 4, 1)


def write(tmp_path, doc) -> str:
    path = tmp_path / "r.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def test_bad_files_are_one_clear_error(tmp_path):
    good = json.loads(results.dumps(profiled().result()))
    cases = [
        ("not json {", "not a memlab_rs result file \\(not JSON"),
        ({"hello": 1}, 'no "format": "memlab_rs.result"'),
        ({**good, "schema": 99}, "schema 99 by a newer memlab_rs"),
        ({**good, "schema": "one"}, "bad schema version"),
        ({**good, "kind": "nope"}, "unknown result kind 'nope'"),
        ({**good, "data": None}, 'without its "meta" or "data"'),
    ]
    for doc, message in cases:
        path = write(tmp_path, doc)
        with pytest.raises(ValueError, match=message) as err:
            memlab_rs.load(path)
        assert str(err.value).startswith(path)
    with pytest.raises(FileNotFoundError, match="no such result file"):
        memlab_rs.load(tmp_path / "missing.json")


def test_a_result_is_plain_json():
    text = results.dumps(profiled().result())
    doc = json.loads(text)
    assert (doc["format"], doc["schema"], doc["kind"]) == ("memlab_rs.result", 1, "line_profile")
    assert results.loads(text).text() == profiled().result().text()
