"""A line profile as a result: saved and loaded, it renders identically (text, HTML, CSV,
records); it holds exact values and the functions' source; it shows any subset of its
functions and columns; and damaged data is one ValueError naming the file, the kind and
the field (its schema is its serde derive, src/line_profiler/result.rs)."""

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


def test_render_in_each_format_is_that_formats_method():
    """``render(format)`` (what ``memlab-rs show`` and ``merge`` print) is the format's own
    method: text and HTML show the default columns, CSV every column, unless told."""
    result = profiled().result()
    merged = memlab_rs.merge_results([result, result], ranks=[0, 1])
    for shown in (result, merged):
        assert shown.render("text") == shown.text() != shown.text(columns=None)
        assert shown.render("html") == shown.html()
        assert shown.render("csv") == shown.to_csv()
        assert shown.render("text", columns=None) == shown.text(columns=None)
        assert shown.render("csv", columns=COLUMNS) == shown.to_csv(columns=COLUMNS)
    assert "allocated_bytes.all.freed" in result.render("csv").splitlines()[0]


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


def test_selecting_functions_and_columns():
    result = profiled().result()
    assert result.text(func="make_two") == result.text()
    with pytest.raises(ValueError, match="no function 'nope' in this line profile"):
        result.text(func="nope")
    with pytest.raises(ValueError, match="unknown column 'bogus'"):
        result.text(columns=["bogus"])


def test_a_damaged_line_profile_names_the_field(tmp_path):
    good = json.loads(results.dumps(profiled().result()))
    damaged = json.loads(json.dumps(good))
    damaged["data"]["functions"][0]["lines"][1][3] = [1, 2]
    cases = [
        (
            {**good, "data": {"columns": []}},
            "a damaged line_profile result: missing field `functions`",
        ),
        (
            damaged,
            r"a damaged line_profile result: functions\[0\]\.lines\[1\]\[3\]: line \d+ of "
            "make_two: 2 values for",
        ),
    ]
    for doc, message in cases:
        path = tmp_path / "r.json"
        path.write_text(json.dumps(doc))
        with pytest.raises(ValueError, match=message) as err:
            memlab_rs.load(path)
        assert str(err.value).startswith(str(path))
