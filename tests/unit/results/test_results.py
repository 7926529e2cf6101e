"""Saved results: the common file format (memlab_rs.results) and the line profile's record.
A result saved and loaded renders identically (text, HTML, CSV, records); bad files get
one clear ValueError naming the file and the problem."""

from __future__ import annotations

import gzip
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


@pytest.mark.parametrize("name", ["profile.json", "profile.json.gz"])
def test_line_profile_round_trip_renders_identically(tmp_path, name):
    profiler = profiled()
    result = profiler.result()
    path = tmp_path / name
    result.save(path)
    if name.endswith(".gz"):
        assert gzip.open(path).read(1) == b"{"
    loaded = memlab_rs.load(path)
    assert isinstance(loaded, memlab_rs.LineProfileResult)
    for columns in (memlab_rs.DEFAULT_COLUMNS, COLUMNS, None):
        assert loaded.text(columns=columns) == result.text(columns=columns)
        assert loaded.html(columns=columns) == result.html(columns=columns)
        assert loaded.records(columns=columns) == result.records(columns=columns)
        assert loaded.to_csv(columns=columns) == result.to_csv(columns=columns)
    # The profiler's own report is the result's.
    assert str(profiler.display(columns=COLUMNS)) == loaded.text(columns=COLUMNS)
    assert loaded.meta == result.meta


def test_line_profile_record_holds_exact_values_and_source():
    result = profiled().result()
    assert result.functions == ["make_two"]
    rows = {r["code"].strip(): r for r in result.records(columns=COLUMNS)}
    assert rows["a = torch.empty(256, 1024)  # 1 MiB"]["allocated_bytes.all.allocated"] == 1 << 20
    assert rows["b = torch.empty(128, 1024)  # 512 KiB"]["allocated_bytes.all.allocated"] == 1 << 19
    assert rows["del a"]["allocated_bytes.all.freed"] == 1 << 20
    (block,) = result.to_data()["functions"]
    assert block["filename"] == __file__
    assert block["lines"][0][1].startswith("def make_two():")
    assert set(result.columns) >= set(COLUMNS) | set(memlab_rs.DEFAULT_COLUMNS)


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


def test_selecting_functions_and_columns():
    result = profiled().result()
    assert result.text(func="make_two") == result.text()
    with pytest.raises(ValueError, match="no function 'nope' in this line profile"):
        result.text(func="nope")
    with pytest.raises(ValueError, match="unknown column 'bogus'"):
        result.text(columns=["bogus"])


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
        ({**good, "data": {"columns": []}}, 'line_profile result: line_profile: no "functions"'),
    ]
    damaged = json.loads(json.dumps(good))
    damaged["data"]["functions"][0]["lines"][1][3] = [1, 2]
    cases.append((damaged, "a damaged line_profile result: line_profile: line .*2 values for"))
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
