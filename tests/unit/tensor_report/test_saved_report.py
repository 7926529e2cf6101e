"""The tensor report as a saved result (kind ``tensor_report``): made from CPU tensors of known
sizes, saved to .json and .json.gz and loaded back rendering byte for byte the same (text,
verbose text, HTML, JSON, rows, sections, pandas), its record's exact values, and damaged
data refused with one ValueError naming the file and the field."""

from __future__ import annotations

import json

import pytest
import torch
from made_results import tensor_report
from round_trip import NAMES, refused, saved_and_loaded

import memlab_rs
from memlab_rs import _core, results


def with_cuda_and_note(report):
    """The report with a CUDA section's accounting and an "incomplete" note, made as a
    GPU machine and an interrupted walk would make them (no GPU needed to render them)."""
    # the allocator's one 8 MiB segment: 3 MiB live, 5 MiB free (split)
    blocks = [
        {"size": 3 << 20, "state": "active_allocated"},
        {"size": 5 << 20, "state": "inactive"},
    ]
    state = {"device": 0, "segments": [{"address": 1 << 40, "total_size": 8 << 20, "stream": 0,
             "segment_type": "large", "blocks": blocks}]}  # fmt: skip
    figures = [("cuda:0", 3 << 20, (3 << 20) - 4096, 8 << 20, json.dumps(state))]
    data = json.loads(_core.tensor_report.with_cuda(report.data_json(), figures))
    free = data["sections"][-1]["cuda"]["free_in_reserved"]
    assert (free["free_bytes"], free["largest_free"], free["inactive_split_bytes"]) == (
        5 << 20, 5 << 20, 5 << 20
    )
    data["incomplete"] = "the walk ran during a garbage collection"
    made = memlab_rs.MemoryReport.from_data(data, report.meta)
    line = "Free inside reserved segments: 5.0 MiB in 1 segments, the largest free block 5.0 MiB"
    assert line in made.text()
    return made


@pytest.mark.parametrize("name", NAMES)
def test_tensor_report_round_trip(tmp_path, name):
    for report in (
        tensor_report(),
        tensor_report(top=2, verbose=True),
        tensor_report(sort_by="size", top=1),
        with_cuda_and_note(tensor_report(top=3)),
    ):
        loaded = saved_and_loaded(report, tmp_path, name)
        assert loaded.to_text() == report.to_text()
        assert loaded.to_text(verbose=True) == report.to_text(verbose=True)
        assert loaded._repr_html_() == report._repr_html_() == report.html()
        # the names every result shares: text() is to_text(), str and repr print it
        assert str(loaded) == repr(loaded) == loaded.text() == report.to_text()
        assert loaded.text(verbose=True) == report.to_text(verbose=True)
        assert loaded.to_json() == report.to_json()
        assert loaded.to_dict() == report.to_dict()
        assert loaded.rows == report.rows
        assert loaded.sections() == report.sections()
        assert loaded.devices == report.devices
        assert loaded.verbose == report.verbose
        assert loaded.to_dataframe().equals(report.to_dataframe())
        assert loaded.to_data()["walk"]["strategy"] == report.to_data()["walk"]["strategy"]
        assert loaded.incomplete == report.incomplete


def test_tensor_report_record_holds_exact_values():
    # Every row: tensors other tests left alive in this process may outrank the view.
    report = tensor_report()
    assert report.meta["device"] == "cpu"
    (section,) = report.to_data()["sections"]
    rows = {r["name"]: r for r in section["rows"]}
    assert (rows["weight"]["bytes"], rows["weight"]["shape"]) == (1 << 20, [256, 1024])
    assert rows["weight"]["shape_text"] == "(256, 1024)"
    assert (rows["bias"]["bytes"], rows["bias"]["numel"]) == (1024, 256)
    shared = [r for r in section["rows"] if r["shared_with"] == "weight"]
    assert [(r["shape"], r["bytes"], r["storage_bytes"]) for r in shared] == [
        ([262144], 0, 1 << 20)
    ]
    (cut,) = tensor_report(top=2).to_data()["sections"]
    assert [r["name"] for r in cut["rows"]] == ["weight", "bias"]
    assert cut["omitted_rows"] >= 1  # the view, at least
    assert cut["omitted_bytes"] == cut["total_bytes"] - (1 << 20) - 1024
    assert section["cuda"] is None
    assert report.to_data()["walk"]["tensors"] >= 3

    loaded = memlab_rs.results.loads(results.dumps(with_cuda_and_note(report)))
    cuda = next(s for s in loaded.sections() if s["device"] == "cuda:0")
    assert (cuda["allocated"], cuda["requested"], cuda["reserved"]) == (
        3 << 20,
        (3 << 20) - 4096,
        8 << 20,
    )
    assert cuda["unseen_tensors"] == (3 << 20) - 4096
    text = loaded.to_text()
    assert "= torch.cuda.memory_allocated(cuda:0)" in text
    assert text.endswith("Incomplete: the walk ran during a garbage collection\n")
    assert "<b>Incomplete:</b> the walk ran during a garbage collection" in loaded._repr_html_()


def test_tensor_report_printed_by_report_is_the_records(capsys):
    linear = torch.nn.Linear(4, 2)
    reporter = memlab_rs.MemReporter(linear)
    reporter.report(device="cpu", top=2)
    printed = capsys.readouterr().out
    assert printed == reporter.collect(device="cpu", top=2).to_text()


def test_damaged_tensor_report_is_refused(tmp_path):
    report = tensor_report(top=2)

    def bad_bytes(data):
        data["sections"][0]["rows"][0]["bytes"] = "many"

    def no_rows(data):
        del data["sections"][0]["rows"]

    def bad_strategy(data):
        data["walk"]["strategy"] = "telepathy"

    def bad_verbose(data):
        data["verbose"] = "yes"

    def negative(data):
        data["sections"][0]["total_bytes"] = -1

    def too_big(data):
        data["sections"][0]["rows"][1]["numel"] = 1 << 63

    # Each names the field by its path in the data, and what it must be.
    refused(
        tmp_path,
        report,
        bad_bytes,
        r'sections\[0\]\.rows\[0\]\.bytes: invalid type: string "many", expected u64',
    )
    refused(tmp_path, report, no_rows, r"sections\[0\]: missing field `rows`")
    refused(tmp_path, report, bad_strategy, 'walk.strategy: unknown strategy "telepathy"')
    refused(
        tmp_path, report, bad_verbose, 'verbose: invalid type: string "yes", expected a boolean'
    )
    refused(
        tmp_path,
        report,
        negative,
        r"sections\[0\]\.total_bytes: invalid value: integer `-1`, expected u64",
    )
    refused(
        tmp_path,
        report,
        too_big,
        r"sections\[0\]\.rows\[1\]\.numel: invalid value: integer `9223372036854775808`, "
        "expected a whole number from 0 to 2\\^63 - 1",
    )


def test_memory_report_core_data_round_trips():
    report = tensor_report()
    assert _core.tensor_report.validate(report.data_json()) == report.data_json()
    again = memlab_rs.MemoryReport.from_data(report.to_data(), report.meta)
    assert again.render("text", verbose=True) == report.render("text", verbose=True)
    assert again.render("json") == report.render("json")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "invalid value: integer `-1`"),
        (2**70, "invalid type: floating point"),
        ("6 MiB", 'invalid type: string "6 MiB"'),
        (1.5, "invalid type: floating point"),
    ],
)
def test_a_damaged_paused_region_figure_is_refused(tmp_path, value, message):
    report = with_cuda_and_note(tensor_report())

    def damage(data):
        data["sections"][-1]["cuda"]["paused_in_regions"] = value

    refused(tmp_path, report, damage, r"sections\[\d+\]\.cuda\.paused_in_regions: " + message)


def test_a_paused_region_figure_round_trips_and_is_said(tmp_path):
    made = with_cuda_and_note(tensor_report())
    data = json.loads(results.dumps(made))["data"]
    assert "paused_in_regions" not in data["sections"][-1]["cuda"]  # absent when none
    data["sections"][-1]["cuda"]["paused_in_regions"] = 6 << 20
    report = memlab_rs.MemoryReport.from_data(data, made.meta)
    loaded = saved_and_loaded(report, tmp_path, "paused.json")
    assert "(6.0 MiB of it in paused Courtesy regions" in loaded.text()
