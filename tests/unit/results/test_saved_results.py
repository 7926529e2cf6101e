"""Every tool's result saves to one file format and loads back rendering identically.

For each kind (estimate, monitor, trace; the tensor report and the tracker in their rooms,
tests/unit/tensor_report and tests/unit/tracker): a real result made from CPU tensors of
known sizes, saved to .json and .json.gz, loaded with ``memlab_rs.load``, its renderings
(text, HTML, and CSV/JSON where the tool has them) compared byte for byte, exact values
checked, and damaged data refused with one ValueError naming the file. Then what every kind
shares: the schema's version, migrated or refused.
"""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch
from made_results import tensor_report, tracked
from round_trip import NAMES, refused, saved_and_loaded

import memlab_rs
from memlab_rs import results

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
    # The fields beside the snapshot are read by their serde derive: the path names the field.
    refused(
        tmp_path,
        simple,
        bad_frame_index,
        r"stacks\[0\]\[0\]: frame \d+, but the trace lists \d+ frames: a stack lists frame indices",
    )
    refused(
        tmp_path, simple, bad_exclude, r"exclude\[0\]: invalid type: integer `1`, expected a string"
    )
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
