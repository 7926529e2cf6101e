"""Tensor reports merged (several ranks, tensor by tensor: ``MergedTensorReport``) and
compared (two runs: ``TensorReportDiff``) on reports made in process: exact per-rank values,
unnamed tensors matched by what they are, the merged kind saved and loaded back, and a
merged report built by hand checked as a loaded one is."""

from __future__ import annotations

import pytest
from made_results import WIDTH, reports_with

import memlab_rs
from memlab_rs import diff_results, merge_results, results
from memlab_rs.tensor_report import MergedTensorReport, TensorReportDiff


def test_unnamed_tensors_are_matched_by_shape_not_by_number():
    a = reports_with([128, 256])
    b = reports_with([256, 128, 512])  # found in another order: numbered differently
    merged = merge_results([a, b], ranks=[0, 1])
    rows = {r["shape"]: r for r in merged.records() if r["name"] == "(unnamed)"}

    def nbytes(n: int) -> int:
        return n * WIDTH * 4

    assert (rows[f"(128, {WIDTH})"]["rank0"], rows[f"(128, {WIDTH})"]["rank1"]) == (
        nbytes(128),
        nbytes(128),
    )
    assert (rows[f"(256, {WIDTH})"]["rank0"], rows[f"(256, {WIDTH})"]["rank1"]) == (
        nbytes(256),
        nbytes(256),
    )
    assert (rows[f"(512, {WIDTH})"]["rank0"], rows[f"(512, {WIDTH})"]["rank1"]) == (
        0,
        nbytes(512),
    )
    assert merged.records()[0]["shape"] == f"(512, {WIDTH})"  # the imbalance first
    change = diff_results(a, b)
    assert [(r["name"], r["shape"], r["change"]) for r in change.rows] == [
        ("(unnamed)", f"(512, {WIDTH})", nbytes(512))
    ]
    assert change.totals[0]["change"] == nbytes(512)


def test_merged_tensor_report_round_trip(tmp_path):
    merged = merge_results([reports_with([128]), reports_with([256])], ranks=[0, 1])
    merged.save(tmp_path / "m.json")
    loaded = memlab_rs.load(tmp_path / "m.json")
    assert type(loaded) is memlab_rs.MergedTensorReport
    assert loaded.text() == merged.text() and loaded.to_csv() == merged.to_csv()
    assert loaded.html() == merged.html()


def test_a_merged_report_made_by_hand_reads_as_a_loaded_one():
    rows = [
        {"name": "w", "device": "cpu", "shape": [2, 2], "dtype": "torch.float32",
         "bytes": [16, 48]},
        {"name": "s", "device": "cuda", "shape": "(s0,)", "dtype": "torch.float16",
         "bytes": [0, 512]},
    ]  # fmt: skip
    totals = {"cpu": [16, 48], "cuda": [0, 512]}
    merged = MergedTensorReport([0, 1], 2, rows, totals, {"world_size": 2})
    assert (merged.ranks, merged.world_size, merged.rows, merged.totals) == (
        [0, 1], 2, rows, totals
    )  # fmt: skip
    records = merged.records()
    assert records[0] == {
        "name": "w", "device": "cpu", "dtype": "torch.float32", "shape": "(2, 2)",
        "min": 16, "median": 32, "max": 48, "max_rank": 1, "rank0": 16, "rank1": 48,
    }  # fmt: skip
    assert records[1]["shape"] == "(s0,)" and records[1]["median"] == 256
    # two ranks' median between two odd sizes is a float, as statistics.median gives it
    odd = MergedTensorReport([0, 1], 2, [{**rows[0], "bytes": [1, 2]}], {}, {})
    assert odd.records()[0]["median"] == 1.5
    assert odd.to_csv().splitlines()[1] == 'w,cpu,torch.float32,"(2, 2)",1,1.5,2,1,1,2'
    assert merged.text().splitlines()[0] == "# merged tensor report: ranks 0, 1 of 2"
    with pytest.raises(ValueError, match=r"rows\[0\]\.bytes: 1 sizes for 2 ranks"):
        MergedTensorReport([0, 1], 2, [{**rows[0], "bytes": [16]}], totals, {})
    with pytest.raises(ValueError, match=r"ranks: lists a rank twice: \[1, 1\]"):
        MergedTensorReport([1, 1], 2, rows, totals, {})
    # what memlab-rs merge --format csv writes: what Python's csv module writes of the records
    assert merged.render("csv") == merged.to_csv() == results.write_csv(records)
    with pytest.raises(
        ValueError, match="format='json': a merged_tensor_report result renders as text, html, csv"
    ):
        merged.render("json")


def test_the_diff_of_two_reports_is_a_tensor_report_diff():
    a, b = reports_with([128]), reports_with([128, 64])
    change = diff_results(a, b)
    assert type(change) is TensorReportDiff and change.kind == "tensor_report"
    (row,) = change.rows
    assert change.where(row) == f"(unnamed) ({row['device']})"
    assert (row["shape"], row["a"], row["b"]) == (f"(64, {WIDTH})", 0, 64 * WIDTH * 4)
    text = change.text().splitlines()
    assert text[0] == "# tensor report diff: A -> B"
    assert text[3:5] == ["grew:", f"    +255.25K  (unnamed)  (64, {WIDTH}) torch.float32  "
                                  "(0.00B -> 255.25K)"]  # fmt: skip
    assert change.regressions(over="255K") == [row]
    assert change.to_data() == {
        "kind": "tensor_report", "names": ["A", "B"], "rows": change.rows,
        "totals": change.totals,
    }  # fmt: skip
