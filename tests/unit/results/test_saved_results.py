"""Every tool's result saves to one file format and loads back rendering identically.

For each kind (tensor report, tracker, estimate, monitor, trace): a real result made from
CPU tensors of known sizes, saved to .json and .json.gz, loaded with ``memlab_rs.load``,
its renderings (text, HTML, and CSV/JSON where the tool has them) compared byte for byte,
exact values checked, and damaged data refused with one ValueError naming the file.
"""

from __future__ import annotations

import copy
import gzip
import json
import os

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
    assert results.dumps(loaded) == results.dumps(result)  # saved again: the same file
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
        assert loaded._table.walk_strategy == report._table.walk_strategy
        assert loaded._table.incomplete == report._table.incomplete


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

    refused(
        tmp_path, report, bad_bytes, r'section 0 \(cpu\), row 0: "bytes" must be int, got .many'
    )
    refused(tmp_path, report, no_rows, r'section 0 \(cpu\): no "rows" field')
    refused(tmp_path, report, bad_strategy, 'unknown strategy "telepathy"')
    refused(tmp_path, report, bad_verbose, '"verbose" must be true or false')
    refused(tmp_path, report, negative, 'section 0 \\(cpu\\): "total_bytes" must be >= 0, got -1')


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


def test_tracker_note_round_trips(tmp_path):
    import dataclasses

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

    refused(tmp_path, gpt, bad_peak, 'peak_allocated: invalid type: string "lots", expected u64')
    refused(tmp_path, gpt, bad_steps, 'step_peaks: must be keyed by step numbers, got "first"')
    refused(tmp_path, gpt, bad_notes, r"notes\[0\]: invalid type: integer `1`, expected a string")
    refused(
        tmp_path, gpt, bad_category, "peak_by_category.activation: invalid type: null, expected u64"
    )


# -- monitor -------------------------------------------------------------------------------


def monitored(tmp_path):
    """TinyGPT trained 5 iterations over 2 epochs with AdamW, verbose, every 2nd printed,
    with the CSV: the monitor, what it printed, its CSV file, and the result after step 4."""
    import io

    from memlab_rs.models import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(vocab=100, dim=32, layers=2, heads=4, context=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.zeros(2, 16, dtype=torch.long)
    out = io.StringIO()
    monitor = memlab_rs.memory_profiler(
        model, 2, True, optimizer=opt, verbose=True, csv_dir=tmp_path / "csv", file=out
    )
    with monitor:
        for epoch_size in (3, 2):
            for _ in range(epoch_size):
                model(tokens).sum().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                monitor.record_stats()
                if len(monitor.rows()) == 4:
                    at_four = monitor.result()
            monitor.epoch_end()
    csv = open(monitor.csv_path).read()
    return model, monitor, out.getvalue(), csv, at_four


@pytest.mark.parametrize("name", NAMES)
def test_monitor_round_trip(tmp_path, name):
    _model, monitor, printed, csv, at_four = monitored(tmp_path)
    result = monitor.result()
    assert len(at_four.rows()) == 4 and len(result.rows()) == 5  # a copy, not a view
    for each in (result, at_four):
        loaded = saved_and_loaded(each, tmp_path, name)
        for step in range(1, len(each.rows()) + 1):
            assert loaded.text(step) == each.text(step) == monitor.text(step)
            assert loaded.csv_row(step) == each.csv_row(step)
        assert loaded.text() == each.text()
        assert loaded.rows() == each.rows()
        assert loaded.plot_html() == each.plot_html()
        assert loaded._repr_html_() == each._repr_html_()
        assert loaded.to_csv() == each.to_csv()
        assert loaded.to_dataframe().equals(each.to_dataframe())
        assert loaded.device == "cpu" and loaded.verbose and loaded.print_period == 2
    # What the monitor printed and wrote is the record's rendering.
    loaded = results.loads(results.dumps(result))
    assert loaded.to_csv() == csv
    assert loaded.printed_steps() == [2, 5]  # iteration 2 of epoch 1, iteration 2 of epoch 2
    for step in loaded.printed_steps():
        assert "\n" + loaded.text(step) + "\n" in printed
    assert monitor.plot_html() == loaded.plot_html()


def test_monitor_record_holds_exact_values(tmp_path):
    model, monitor, _printed, _csv, _at_four = monitored(tmp_path)
    data = monitor.result().to_data()
    storages = {
        p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()
    }
    assert all(r["weight_usage"] == sum(storages.values()) for r in data["rows"])
    assert [(r["epoch"], r["iteration"]) for r in data["rows"]] == [
        (1, 1),
        (1, 2),
        (1, 3),
        (2, 1),
        (2, 2),
    ]
    # AdamW's two moments (and a step counter each) per parameter, from step 1 on.
    assert all(r["optimizer_state_usage"] >= 2 * sum(storages.values()) for r in data["rows"])
    (layout,) = data["layouts"]  # the parameters never changed: one layout
    assert "wte.weight+lm_head.weight" in layout["names"]
    assert sum(layout["bytes"]) == sum(storages.values())
    assert data["csv_names"] == layout["names"]
    modules = dict(data["details"][0]["modules"])
    assert modules and all(b >= 0 for b in modules.values())


def test_damaged_monitor_result_is_refused(tmp_path):
    _model, monitor, _printed, _csv, _at_four = monitored(tmp_path)
    result = monitor.result()

    def short_grads(data):
        data["details"][0]["grads"] = data["details"][0]["grads"][:-1]

    def no_notice(data):
        del data["rows"][1]["notice"]

    def bad_layout(data):
        data["details"][2]["layout"] = 7

    def lost_details(data):
        data["details"].pop()

    def bad_module(data):
        data["details"][0]["modules"][0] = ["blocks.0", "big"]

    refused(tmp_path, result, short_grads, r"details\[0\]\.grads: \d+ gradient counts for \d+ rows")
    refused(tmp_path, result, no_notice, r"rows\[1\]: missing field `notice`")
    refused(tmp_path, result, bad_layout, r"details\[2\]\.layout: 7 is not one of 1 layouts")
    refused(tmp_path, result, lost_details, "details: 4 details for 5 rows")
    refused(
        tmp_path,
        result,
        bad_module,
        r'details\[0\]\.modules\[0\]\[1\]: invalid type: string "big", expected i64',
    )


# -- trace ---------------------------------------------------------------------------------


def make_two():
    a = torch.empty(256, 1024)  # 1 MiB
    b = torch.empty(128, 1024)  # 512 KiB
    del a
    return b


def traced():
    """A region with known sizes, and a TinyGPT step traced with module tags."""
    from memlab_rs.models import TinyGPT

    with memlab_rs.trace.Tracer(device="cpu") as simple:
        kept = make_two()
    del kept
    model = TinyGPT(vocab=100, dim=32, layers=2, heads=4, context=16)
    tokens = torch.zeros(2, 16, dtype=torch.long)
    with memlab_rs.trace.Tracer(device="cpu", model=model, tag_modules=True) as tagged:
        model(tokens).sum().backward()
    return simple.result, tagged.result


def trace_renderings(result):
    return {
        "text": result.text(),
        "module_text": result.module_text(),
        "html": result._repr_html_(),
        "json": result.to_json(),
        "csv": result.to_csv(),
        "timeline_html": result.timeline_html(),
        "untagged": result.untagged_log(),
        "rows": result.rows(),
        "module_rows": result.module_rows(),
        "summary": result.summary(),
        "notices": result.notices(),
        "lines": result.line_peak_live(),
        "devices": result.devices,
        "source": result.source,
        "frame": result.to_dataframe().to_dict(),
    }


@pytest.mark.parametrize("name", NAMES)
def test_trace_round_trip(tmp_path, name):
    for result in traced():
        expected = trace_renderings(result)
        loaded = saved_and_loaded(result, tmp_path, name)
        assert trace_renderings(loaded) == expected
        assert loaded.exclude == result.exclude
        # trace.load reads the result file too, and a new exclude list re-analyses it.
        again = memlab_rs.trace.load(tmp_path / name)
        assert trace_renderings(again) == expected and again.meta == result.meta
        assert memlab_rs.trace.load(tmp_path / name, exclude=[]).exclude == []


def test_trace_record_holds_exact_values(tmp_path):
    simple, tagged = traced()
    assert simple.meta["device"] == "cpu"
    loaded = results.loads(results.dumps(simple))
    # Tensors other tests left alive before the trace began count as 'untraced'.
    untraced = sum(r.bytes for r in loaded.rows("cpu") if r.location == "untraced")
    assert loaded.max_mem("cpu") - untraced == (1 << 20) + (1 << 19)
    first = make_two.__code__.co_firstlineno
    rows = {r.location: (r.bytes, r.count) for r in loaded.rows("cpu")}
    # Short paths: relative to the working directory the trace was recorded in.
    here = os.path.relpath(__file__, simple.snapshot["memlab_rs"]["cwd"])
    here = __file__ if here.startswith("..") else here
    assert rows[f"{here}:{first + 1} (make_two)"] == (1 << 20, 1)  # a and b: the peak
    assert rows[f"{here}:{first + 2} (make_two)"] == (1 << 19, 1)
    data = simple.to_data()
    assert data["source"] == "cpu" and data["exclude"] == simple.exclude
    assert data["paths"] == "short"
    # Frames and stacks are listed once; each entry names its stack by index.
    (entries,) = data["snapshot"]["device_traces"]
    allocs = [e for e in entries if e["action"] == "alloc" and e["size"] in (1 << 20, 1 << 19)]
    assert len(allocs) == 2 and all(isinstance(e["frames"], int) for e in allocs)
    stack = [data["frames"][i] for i in data["stacks"][allocs[0]["frames"]]]
    assert stack[0]["name"] == "make_two" and stack[0]["filename"] == __file__
    assert stack[0]["line"] == make_two.__code__.co_firstlineno + 1
    # A tagged step's module rows come back with their tags.
    modules = [r.location for r in results.loads(results.dumps(tagged)).module_rows()]
    assert any(m.startswith("forward:") for m in modules)


def test_trace_load_keeps_reading_pickles_and_json_snapshots(tmp_path):
    simple, _tagged = traced()
    simple.save(tmp_path / "trace.pickle")  # not .json: torch's pickle, as before
    assert (tmp_path / "trace.pickle").read_bytes()[:2] == b"\x80\x04"
    from_pickle = memlab_rs.trace.load(tmp_path / "trace.pickle")
    assert from_pickle.text() == simple.text()
    assert from_pickle.meta["snapshot_file"] == str(tmp_path / "trace.pickle")
    simple.export_memory_viz(tmp_path / "viz.json", format="json")
    assert memlab_rs.trace.load(tmp_path / "viz.json").text() == simple.text()
    # A result of another kind is named, not misread.
    tensor_report().save(tmp_path / "report.json")
    with pytest.raises(ValueError, match="a memlab_rs tensor_report result, not a trace"):
        memlab_rs.trace.load(tmp_path / "report.json")


def test_damaged_trace_is_refused(tmp_path):
    simple, _tagged = traced()

    def bad_stack(data):
        (entries,) = data["snapshot"]["device_traces"]
        next(e for e in entries if isinstance(e.get("frames"), int))["frames"] = 10**6

    def bad_frame_index(data):
        data["stacks"][0] = [len(data["frames"])]

    def bad_exclude(data):
        data["exclude"] = [1]

    def wrong_source(data):
        data["source"] = "cuda"

    def no_snapshot(data):
        del data["snapshot"]

    refused(tmp_path, simple, bad_stack, 'a "frames" entry names stack 1000000')
    refused(tmp_path, simple, bad_frame_index, "trace: stack 0 must list frame indices")
    refused(tmp_path, simple, bad_exclude, r'trace: "exclude"\[0\] must be str, got 1')
    refused(tmp_path, simple, wrong_source, "\"source\" says 'cuda' but the snapshot is a cpu one")
    refused(tmp_path, simple, no_snapshot, 'trace: no "snapshot" field')


# -- schema versions -------------------------------------------------------------------------


def test_an_older_schema_is_migrated_or_refused_clearly(tmp_path, monkeypatch):
    """As a memlab_rs with schema 2 would see today's files: migrated when it knows how,
    else refused with a message saying which memlab_rs reads it."""
    report = tensor_report()
    path = tmp_path / "old.json"
    report.save(path)
    monkeypatch.setattr(results.files, "SCHEMA", 2)  # where the reader looks
    with pytest.raises(ValueError, match="result schema 1 can no longer be read") as err:
        memlab_rs.load(path)
    assert str(err.value).startswith(str(path)) and "the memlab_rs that wrote it" in str(err.value)

    seen = []

    def to_schema_2(doc):  # the made-up schema 2 keeps the layout: only the version moves
        seen.append(doc["schema"])
        return {**copy.deepcopy(doc), "schema": 2}

    monkeypatch.setitem(results.files._MIGRATIONS, 1, to_schema_2)
    loaded = memlab_rs.load(path)
    assert seen == [1]
    assert loaded.to_text() == report.to_text()
    assert loaded._repr_html_() == report._repr_html_()


def test_a_newer_schema_is_refused_for_every_kind(tmp_path):
    made = [tensor_report(), tracked(tmp_path)[1], traced()[0]]
    for result in made:
        doc = json.loads(results.dumps(result))
        doc["schema"] = results.SCHEMA + 1
        path = tmp_path / f"{result.kind}.json"
        path.write_text(json.dumps(doc))
        with pytest.raises(ValueError, match=f"written with result schema {results.SCHEMA + 1}"):
            memlab_rs.load(path)
