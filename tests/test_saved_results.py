"""Every tool's result saves to one file format and loads back rendering identically.

For each kind (tensor report, tracker, estimate, monitor, trace): a real result made from
CPU tensors of known sizes, saved to .json and .json.gz, loaded with ``memlab_rs.load``,
its renderings (text, HTML, and CSV/JSON where the tool has them) compared byte for byte,
exact values checked, and damaged data refused with one ValueError naming the file.
"""

from __future__ import annotations

import gzip
import json

import pytest
import torch

import memlab_rs
from memlab_rs import _core, results

NAMES = ["result.json", "result.json.gz"]


def saved_and_loaded(result, tmp_path, name):
    """``result`` saved to ``tmp_path/name`` and loaded back, after checking the file."""
    path = tmp_path / name
    result.save(path)
    raw = gzip.open(path).read() if name.endswith(".gz") else path.read_bytes()
    doc = json.loads(raw)
    assert (doc["format"], doc["schema"], doc["kind"]) == (results.FORMAT, 1, result.kind)
    loaded = memlab_rs.load(path)
    assert type(loaded) is type(result)
    assert loaded.meta == result.meta
    return loaded


def refused(tmp_path, result, damage, message):
    """The result's document, damaged by ``damage(data)``, fails to load with ``message``."""
    doc = json.loads(results.dumps(result))
    damage(doc["data"])
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=message) as err:
        memlab_rs.load(path)
    assert str(err.value).startswith(f"{path}: a damaged {result.kind} result")


# -- tensor report ---------------------------------------------------------------------------


def tensor_report(**kwargs):
    linear = torch.nn.Linear(1024, 256)  # weight 1 MiB, bias 1 KiB
    view = linear.weight.view(-1)  # shares the weight's storage
    report = memlab_rs.MemReporter(linear).collect(device="cpu", **kwargs)
    del view
    return report


def with_cuda_and_note(report):
    """The report with a CUDA section's accounting and an "incomplete" note, made as a
    GPU machine and an interrupted walk would make them (no GPU needed to render them)."""
    table = report._table.with_cuda("cuda:0", 3 << 20, (3 << 20) - 4096, 8 << 20)
    data = {**report.to_data(), **table.data()}
    data["incomplete"] = "the walk ran during a garbage collection"
    return memlab_rs.MemoryReport.from_data(data, report.meta)


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
        assert loaded._repr_html_() == report._repr_html_()
        assert loaded.to_json() == report.to_json()
        assert loaded.to_dict() == report.to_dict()
        assert loaded.rows == report.rows
        assert loaded.sections() == report.sections()
        assert loaded.devices == report.devices
        assert loaded.verbose == report.verbose
        assert loaded.to_dataframe().equals(report.to_dataframe())
        assert loaded._table.walk_strategy == report._table.walk_strategy
        assert loaded._table.incomplete == report._table.incomplete


def test_tensor_report_record_holds_exact_values():
    report = tensor_report(top=3)
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

    refused(tmp_path, report, bad_bytes, r'section 0 \(cpu\), row 0: "bytes" has the wrong type')
    refused(tmp_path, report, no_rows, r'section 0 \(cpu\): no "rows" field')
    refused(tmp_path, report, bad_strategy, 'unknown strategy "telepathy"')
    refused(tmp_path, report, bad_verbose, '"verbose" must be true or false')
    refused(tmp_path, report, negative, '"total_bytes" has the wrong type')


def test_memory_report_core_data_round_trips():
    table = tensor_report()._table
    again = _core.ReportTable.from_data(table.data())
    assert again.text(True) == table.text(True)
    assert again.json() == table.json()


# -- tracker -------------------------------------------------------------------------------


def tracked(tmp_path, detail=True):
    """Two tracks: the first (with the log's header), then one that sees a 1 MiB tensor
    and a named 512 KiB parameter appear and the first's 256 KiB tensor vanish."""
    model = torch.nn.Module()
    tracker = memlab_rs.MemTracker(
        detail=detail, path=str(tmp_path) + "/", device="cpu", model=model
    )
    gone = torch.zeros(64, 1024)  # 256 KiB
    first = tracker.track()
    del gone
    kept = torch.zeros(256, 1024)  # 1 MiB
    model.w = torch.nn.Parameter(torch.zeros(128, 1024))  # 512 KiB, named "w"
    second = tracker.track()
    log = open(tracker.gpu_profile_fn).read()
    del kept
    return first, second, log


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

    refused(tmp_path, second, bad_sign, r'tracker row 0: "sign" must be "\+" or "-"')
    refused(tmp_path, second, bad_bytes, r'tracker row 0: "bytes" must be >= 0, got -5')
    refused(tmp_path, second, no_where, 'tracker: no "where" field')
    refused(tmp_path, second, bool_count, 'tracker row 0: "count" must be int, got True')


# -- estimate ------------------------------------------------------------------------------


def estimates():
    from memlab_rs.models import TinyGPT

    model = TinyGPT(vocab=100, dim=32, layers=2, heads=4, context=16)
    tokens = torch.zeros(2, 16, dtype=torch.long)
    gpt = memlab_rs.estimate(
        model, tokens, optimizer=torch.optim.AdamW, optimizer_kwargs={"lr": 1e-3}, device="cpu"
    )
    linear = memlab_rs.estimate(  # the CUDA allocator modelled, no GPU needed
        torch.nn.Linear(1000, 1000), torch.zeros(8, 1000), device="cuda:0"
    )
    return model, gpt, linear


@pytest.mark.parametrize("name", NAMES)
def test_estimate_round_trip(tmp_path, name):
    _model, gpt, linear = estimates()
    for est in (gpt, linear):
        loaded = saved_and_loaded(est, tmp_path, name)
        assert loaded.text() == est.text()
        assert str(loaded) == str(est)
        assert loaded._repr_html_() == est._repr_html_()
        assert loaded.to_dict() == est.to_dict()
        assert loaded.to_json() == est.to_json()
        assert loaded == est  # every field
        assert loaded.step_peaks == est.step_peaks and 1 in loaded.step_peaks


def test_estimate_record_holds_exact_values():
    model, gpt, linear = estimates()
    storages = {
        p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()
    }
    assert gpt.parameters == sum(storages.values())  # the tied head counted once
    assert gpt.meta["device"] == "cpu" and linear.meta["device"] == "cuda:0"
    assert linear.parameters == 4_004_352  # 4,000,000 and 4,000 bytes, 512-byte blocks
    assert linear.inputs == 32_256
    data = results.loads(results.dumps(linear)).to_data()
    assert data["parameters"] == 4_004_352 and data["notes"] == linear.notes
    assert data["peak_reserved"] == linear.peak_reserved and linear.peak_reserved % (2 << 20) == 0


def test_damaged_estimate_is_refused(tmp_path):
    _model, gpt, _linear = estimates()

    def bad_peak(data):
        data["peak_allocated"] = "lots"

    def bad_steps(data):
        data["step_peaks"] = {"first": 1}

    def bad_notes(data):
        data["notes"] = [1]

    def bad_category(data):
        data["peak_by_category"]["activation"] = None

    refused(tmp_path, gpt, bad_peak, 'estimate: "peak_allocated" must be int')
    refused(tmp_path, gpt, bad_steps, '"step_peaks" must be keyed by step numbers')
    refused(tmp_path, gpt, bad_notes, '"notes" must be a list of strings')
    refused(tmp_path, gpt, bad_category, 'estimate peak_by_category: "activation" must be int')
