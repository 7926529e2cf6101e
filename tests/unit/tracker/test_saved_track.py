"""The tracker's result as a saved result (kind ``tracker``): two tracks of known tensors,
saved to .json and .json.gz and loaded back rendering byte for byte the same (the log's
block, HTML), every field equal, its record's exact values, and damaged data refused with
one ValueError naming the file and the field."""

from __future__ import annotations

import dataclasses
import json

import pytest
from made_results import tracked
from round_trip import NAMES, refused, saved_and_loaded

import memlab_rs
from memlab_rs import results


@pytest.mark.parametrize("name", NAMES)
def test_tracker_round_trip(tmp_path, name):
    first, second, log = tracked(tmp_path)
    assert log == first.text() + second.text()  # the log is rendered from the records
    for result in (first, second):
        loaded = saved_and_loaded(result, tmp_path, name)
        assert loaded.text() == result.text()
        assert loaded._repr_html_() == result._repr_html_()
        assert loaded == result  # every field, rows included
        assert loaded.device == "cpu"


def test_tracker_record_holds_exact_values(tmp_path):
    first, second, _log = tracked(tmp_path)
    assert first.stamp is not None and second.stamp is None
    assert first.text().startswith(f"GPU Memory Track | {first.stamp} | ")
    rows = {(r.sign, r.shape): r for r in second.rows}
    assert rows["+", "(256, 1024)"].bytes == 1 << 20
    assert rows["+", "(128, 1024)"].bytes == 1 << 19
    assert rows["+", "(128, 1024)"].names == ("w",)
    assert rows["+", "(128, 1024)"].type == "<class 'torch.nn.parameter.Parameter'>"
    assert rows["-", "(64, 1024)"].bytes == 1 << 18
    data = second.to_data()
    assert data["where"].endswith(": tracked")
    assert {(r["sign"], r["shape"], r["bytes"]) for r in data["rows"]} >= {
        ("+", "(256, 1024)", 1 << 20),
        ("-", "(64, 1024)", 1 << 18),
    }
    html = second._repr_html_()
    assert "<td>1048576</td>" in html.replace('<td style="text-align:right">', "<td>")
    assert "<td>w</td>" in html


def test_tracker_note_round_trips(tmp_path):
    _first, second, _log = tracked(tmp_path)
    noted = dataclasses.replace(second, incomplete="the walk ran during a garbage collection")
    loaded = results.loads(results.dumps(noted))
    assert loaded.text() == noted.text()
    assert loaded.text().endswith("Note: the walk ran during a garbage collection\n\n")
    assert loaded._repr_html_() == noted._repr_html_()
    assert loaded._repr_html_().endswith(
        "<p>Note: the walk ran during a garbage collection</p></div>"
    )


def test_tracker_without_detail_round_trips(tmp_path):
    _first, second, log = tracked(tmp_path, detail=False)
    assert "| Memory:" not in second.text() and second.text() in log
    loaded = results.loads(results.dumps(second))
    assert loaded.text() == second.text() and not loaded.detail
    assert loaded._repr_html_() == second._repr_html_()


def test_damaged_tracker_result_is_refused(tmp_path):
    _first, second, _log = tracked(tmp_path)

    def bad_sign(data):
        data["rows"][0]["sign"] = "*"

    def bad_bytes(data):
        data["rows"][0]["bytes"] = -5

    def no_where(data):
        del data["where"]

    def bool_count(data):
        data["rows"][0]["count"] = True

    # Each names the field by its path in the data, and what it must be.
    refused(tmp_path, second, bad_sign, r'rows\[0\]\.sign: a sign is "\+" or "-", got "\*"')
    refused(
        tmp_path, second, bad_bytes, r"rows\[0\]\.bytes: invalid value: integer `-5`, expected u64"
    )
    refused(tmp_path, second, no_where, "missing field `where`")
    refused(
        tmp_path,
        second,
        bool_count,
        r"rows\[0\]\.count: invalid type: boolean `true`, expected u64",
    )


def test_a_file_saved_before_storage_bytes_reads_its_bytes_for_both(tmp_path):
    # Files written before the storages' own bytes were kept have only the allocator's:
    # those stand for both, and the log's block renders from them as it did then.
    _first, second, _log = tracked(tmp_path)
    doc = json.loads(results.dumps(second))
    for row in doc["data"]["rows"]:
        del row["storage_bytes"]
    del doc["data"]["total_storage_bytes"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    loaded = memlab_rs.load(path)
    assert [(r.bytes, r.storage_bytes) for r in loaded.rows] == [
        (r.bytes, r.bytes) for r in second.rows
    ]
    assert loaded.total_storage_bytes == loaded.total_bytes == second.total_bytes
    assert loaded.text() == second.text()  # on the CPU both counts are the same bytes
    assert loaded.to_data()["rows"][0]["storage_bytes"] == second.rows[0].bytes
