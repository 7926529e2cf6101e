"""memlab_rs.trace: the analysis of allocation histories, on snapshots captured on an H100
(tests/fixtures/trace/capture.py) and on generated histories checked against a model."""

import json
import os
import pickle
import re

import paths
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from trace_snapshots import as_recorded, fixture, generated

from memlab_rs import _core, trace

FIXTURES = paths.FIXTURES / "trace"
ROW = re.compile(r"^(\S+ \S*)  (\S+ \S*)  (\S+ \S*)  (\d+)  (.+)$")


def as_shown(path):
    """`path` as a trace recorded in this working directory shows it by default: relative
    to it when under it (as os.path.relpath says), else in full."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


@pytest.mark.parametrize("name", ["mlp_adam", "gpt2_tiny"])
def test_max_mem_equals_max_memory_allocated_and_rows_add_up(name):
    snapshot, facts = fixture(name)
    result = trace.load(as_recorded(snapshot, facts))
    summary = result.summary("cuda:0")
    assert summary["max_mem"] == facts["peak_allocated"]
    assert summary["start_allocated"] == facts["start_allocated"]
    assert summary["end_allocated"] == facts["end_allocated"]
    rows = result.rows("cuda:0")
    assert sum(r.bytes for r in rows) == facts["peak_allocated"]
    assert rows[-1].cumulative == facts["peak_allocated"]
    assert result.notices("cuda:0") == []
    untraced = [r for r in rows if r.location == "untraced"]
    assert untraced[0].bytes == facts["start_allocated"]
    assert untraced[0].count == facts["start_allocation_count"]


def test_a_users_own_dump_without_our_start_layout_says_the_start_is_inferred():
    snapshot, facts = fixture("gpt2_tiny")
    result = trace.load(snapshot)
    assert result.max_mem(0) == facts["peak_allocated"]
    notices = result.notices(0)
    assert any("inferred" in n for n in notices)
    assert any("requested sizes rounded" in n for n in notices)
    assert "Note: what was allocated before the first entry is inferred" in result.text()


def test_the_peak_table_has_the_peak_tracers_layout():
    snapshot, facts = fixture("mlp_adam")
    text = trace.load(as_recorded(snapshot, facts)).text()
    lines = text.splitlines()
    assert lines[0] == "Max mem: 225.3 MB"
    assert lines[1].startswith("Total mem allocated: ")
    assert lines[2] == "Mem, Cumulative Mem, Median, Count, Location"
    rows = [ROW.match(line) for line in lines[3:]]
    assert all(rows), lines[3:]
    locations = [m.group(5) for m in rows]
    assert "untraced" in locations
    # The two Linear outputs and the Adam states come from the capture script's own lines.
    assert any(re.search(r"capture\.py:\d+ \(mlp_step\)$", loc) for loc in locations)
    assert not any("/torch/" in loc for loc in locations if loc != "(no Python stack)")


def test_gpt2_rows_name_transformers_lines_not_torch():
    snapshot, facts = fixture("gpt2_tiny")
    rows = trace.load(as_recorded(snapshot, facts)).rows(0)
    named = [r.location for r in rows]
    assert any("modeling_gpt2.py" in loc for loc in named)
    assert not any(loc.startswith(".../torch/") for loc in named)
    assert any(loc.startswith(".../transformers/models/gpt2/modeling_gpt2.py:") for loc in named)


def test_exclude_is_configurable():
    snapshot, facts = fixture("gpt2_tiny")
    everything = trace.load(as_recorded(snapshot, facts), exclude=[])
    assert any(r.location.startswith(".../torch/") for r in everything.rows(0))
    full = trace.load(as_recorded(snapshot, facts), exclude=[], paths="full")
    assert any("/site-packages/torch/" in r.location for r in full.rows(0))
    assert everything.max_mem(0) == facts["peak_allocated"]


def test_tags_from_user_metadata_group_the_live_set():
    snapshot, facts = fixture("mlp_adam")  # captured with _set_memory_metadata("step<i>")
    result = trace.load(as_recorded(snapshot, facts))
    tags = {r.location: r.bytes for r in result.module_rows(0)}
    assert set(tags) <= {"untraced", "step0", "step1", "step2", "(untagged)"}
    assert sum(tags.values()) == facts["peak_allocated"]
    csv = result.to_csv().splitlines()
    assert csv[0] == "tag,MiB"
    assert {line.split(",")[0] for line in csv[1:]} == set(tags)
    mib = {line.split(",")[0]: float(line.split(",")[1]) for line in csv[1:]}
    assert mib["untraced"] == pytest.approx(tags["untraced"] / 2**20, abs=1e-6)


def test_keyword_groups_add_others_and_untrackable():
    snapshot, facts = fixture("mlp_adam")
    result = trace.load(as_recorded(snapshot, facts))
    expected = facts["peak_allocated"] + 12345
    groups = result.keywords({"first": ["step0"], "later": ["step1", "step2"]}, expected)
    names = [g for g, _ in groups]
    assert names == ["first", "later", "Others", "Untrackable"]
    values = dict(groups)
    assert values["Untrackable"] == 12345
    assert sum(values.values()) == expected


def test_timeline_peak_is_exact_and_layers_add_up():
    snapshot, facts = fixture("gpt2_tiny")
    view = trace.load(as_recorded(snapshot, facts)).timeline(0, top=4, max_points=50)
    assert view["peak_bytes"] == facts["peak_allocated"]
    assert view["total"][view["peak_index"]] == facts["peak_allocated"]
    assert len(view["total"]) <= 52
    for i, total in enumerate(view["total"]):
        assert sum(layer[1][i] for layer in view["layers"]) == total
    assert view["layers"][-1][0] == "other"


def test_json_round_trips_the_figures():
    snapshot, facts = fixture("mlp_adam")
    result = trace.load(as_recorded(snapshot, facts))
    data = result.to_dict()
    assert data["source"] == "cuda"
    (device,) = data["devices"]
    assert device["device"] == "cuda:0"
    assert device["max_mem"] == facts["peak_allocated"]
    assert sum(r["bytes"] for r in device["locations"]) == facts["peak_allocated"]


def test_saved_pickle_loads_the_same(tmp_path):
    snapshot, facts = fixture("mlp_adam")
    result = trace.load(as_recorded(snapshot, facts))
    path = tmp_path / "trace.pickle"
    result.save(path)
    assert path.read_bytes()[:2] == b"\x80\x04"  # protocol 4, what memory_viz reads
    again = trace.load(path)
    assert again.text() == result.text()


def test_frames_given_as_tuples_keep_their_own_stacks_when_saved():
    """A snapshot built by hand may hold each entry's frames as a tuple. Encoding once
    listed each tuple into a temporary list and remembered its id: the next list often got
    the same id, and about half of 5,000 entries were saved with an earlier entry's
    stack. Each entry's stack must come back as its own."""
    from memlab_rs.trace.saved import decode, encode

    entries = [
        {
            "action": "alloc",
            "addr": 4096 * i,
            "size": 512,
            "frames": tuple(
                {"filename": f"f{i}.py", "line": i + k, "name": f"fn{k}"} for k in range(2)
            ),
        }
        for i in range(2000)
    ]
    snapshot = {"segments": [], "device_traces": [entries]}
    back = decode(json.loads(json.dumps(encode(snapshot))))
    got = back["device_traces"][0]
    assert [e["frames"] for e in got] == [list(e["frames"]) for e in entries]


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="not a memory snapshot.*device_traces"):
        trace.load({"segments": []})
    with pytest.raises(TypeError, match="path or a snapshot dict"):
        trace.load(42)
    with pytest.raises(FileNotFoundError, match="no snapshot file"):
        trace.load("/nonexistent/snap.pickle")
    snapshot, facts = fixture("mlp_adam")
    with pytest.raises(ValueError, match="device 3 has no recorded allocations"):
        trace.load(snapshot).rows(3)


# -- a model-based check of the replay on generated CPU histories ---------------------------
@pytest.mark.parametrize("seed", range(40))
def test_generated_histories_agree_with_a_plain_model(seed):
    snapshot, best, expected = generated(seed)
    result = trace.load(snapshot)
    assert result.source == "cpu"
    assert result.max_mem("cpu") == best
    rows = {r.location: (r.bytes, r.count, r.median) for r in result.rows("cpu")}
    assert rows == {
        loc: (sum(sizes), len(sizes), sorted(sizes)[len(sizes) // 2])
        for loc, sizes in expected.items()
    }


# -- the CPU tracer on code with known allocations ------------------------------------------
def known_step():
    a = torch.empty(256, 1024)  # 1 MiB, alive at the peak
    b = (torch.empty(100), torch.empty(200), torch.empty(300))  # 400 + 800 + 1200 bytes
    c = torch.empty(64, 1024)  # 256 KiB, freed before the peak
    del c
    d = torch.empty(512, 1024)  # 2 MiB: the peak
    return a, b, d


def line_of(func, text):
    import inspect

    lines, first = inspect.getsourcelines(func)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_cpu_tracer_gives_exact_rows_and_max_mem():
    keep = torch.empty(1000)  # 4000 bytes alive before tracing
    with trace.Tracer(device="cpu") as tr:
        out = known_step()
    result = tr.result
    summary = result.summary("cpu")
    start = summary["start_allocated"]
    assert start >= 4000
    assert result.max_mem("cpu") == start + (1 << 20) + 2400 + (2 << 20)
    rows = {r.location: r for r in result.rows("cpu")}
    here = as_shown(__file__)
    a = rows[f"{here}:{line_of(known_step, 'a = torch.empty')} (known_step)"]
    assert (a.bytes, a.count, a.median) == (1 << 20, 1, 1 << 20)
    b = rows[f"{here}:{line_of(known_step, 'b = (torch.empty')} (known_step)"]
    assert (b.bytes, b.count, b.median) == (2400, 3, 800)
    d = rows[f"{here}:{line_of(known_step, 'd = torch.empty')} (known_step)"]
    assert (d.bytes, d.count, d.median) == (2 << 20, 1, 2 << 20)
    assert f"{here}:{line_of(known_step, 'c = torch.empty')} (known_step)" not in rows
    assert rows["untraced"].bytes == start
    assert sum(r.bytes for r in rows.values()) == result.max_mem("cpu")
    text = result.text().splitlines()
    assert text[0] == f"Max mem: {_readable(result.max_mem('cpu'))}"
    assert any(line.startswith("2.000 MB  ") and line.endswith("(known_step)") for line in text)
    del keep, out


def _readable(n):
    """The peak tracer's number format, written again here as its C++ does it."""
    import math

    units = ["", "KB", "MB", "GB"]
    value, unit = float(n), 0
    while unit < 3 and value >= 1024:
        value /= 1024
        unit += 1
    digits = 4 - (int(math.floor(math.log10(abs(value)))) + 1)
    return f"{value:.{digits}f} {units[unit]}"


def test_line_profiler_peak_live_column_on_cpu():
    from memlab_rs import LineProfiler

    with LineProfiler(known_step, device="cpu", peak_live=True) as lp:
        out = known_step()
    records = lp.display(known_step, columns=["peak_live"]).records()
    by_line = {r["line"]: r["peak_live"] for r in records}
    assert by_line[line_of(known_step, "a = torch.empty")] == 1 << 20
    assert by_line[line_of(known_step, "b = (torch.empty")] == 2400
    assert by_line[line_of(known_step, "c = torch.empty")] == 0
    assert by_line[line_of(known_step, "d = torch.empty")] == 2 << 20
    with pytest.raises(ValueError, match="peak_live=True"):
        LineProfiler(known_step, device="cpu").display(columns=["peak_live"])
    del out


def test_tracer_rejects_bad_arguments():
    with pytest.raises(ValueError, match="max_entries"):
        trace.Tracer(device="cpu", max_entries=0)
    with pytest.raises(ValueError, match="tag_modules"):
        trace.Tracer(device="cpu", tag_modules="everything")
    tracer = trace.Tracer(device="cpu")
    with pytest.raises(RuntimeError, match="not recording"):
        tracer.stop()
    with pytest.raises(RuntimeError, match="start_tracing"):
        trace.stop_tracing()


@pytest.mark.parametrize("model", [-1, "net", [torch.nn.Linear(2, 2)], torch.nn.Linear])
def test_a_model_that_is_not_a_module_is_named_before_anything_starts(model):
    with pytest.raises(TypeError, match=r"Tracer\(model=\.\.\.\): model must be a torch\.nn"):
        trace.Tracer(device="cpu", model=model, tag_modules=True)
    assert not _core._cpu_trace_active()


def test_a_start_that_fails_leaves_nothing_running():
    from torch.nn.modules import module

    from memlab_rs.trace.tags import ModuleTagger

    def hooks():
        return dict(module._global_forward_pre_hooks), dict(module._global_forward_hooks)

    with ModuleTagger():  # another tagger is installed: the tracer's cannot be
        before = hooks()
        for _ in range(3):
            failed = trace.Tracer(device="cpu", tag_modules=True)
            with pytest.raises(RuntimeError, match="another ModuleTagger is installed"):
                failed.start()
            assert not _core._cpu_trace_active()
            assert hooks() == before
            with pytest.raises(RuntimeError, match="not recording"):
                failed.stop()
    # The next Tracer starts as if nothing had happened, and so does the failed one.
    for tracer in (trace.Tracer(device="cpu"), failed):
        with tracer:
            x = torch.empty(256, 1024)
        assert tracer.result.max_mem("cpu") >= 1 << 20
        del x


def test_peak_tracer_functions_on_cpu(capsys):
    trace.switch_allocator()
    trace.start_tracing(device="cpu")
    x = torch.empty(256, 1024)
    trace.stop_tracing()
    trace.report_stats()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Max mem: ")
    assert lines[2] == "Mem, Cumulative Mem, Median, Count, Location"
    assert any(line.startswith("1.000 MB  ") and "test_trace.py" in line for line in lines)
    del x


def test_module_view_with_tags_on_cpu():
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    x = torch.randn(32, 64)
    with trace.Tracer(device="cpu", model=model, tag_modules=True) as tr:
        loss = model(x).sum()
    tags = {r.location: r.bytes for r in tr.result.module_rows("cpu")}
    # The first Linear's output (32 x 256 floats) is kept for backward: alive at the peak.
    assert tags["forward:0"] == 32 * 256 * 4
    assert sum(tags.values()) == tr.result.max_mem("cpu")
    del loss


def test_a_recording_from_the_gpu_machine_reports_here_as_it_did_there():
    """tracer_gpt2_tiny.pickle: recorded by Tracer(tag_modules=True) on an H100 (torch 2.11,
    capture.py --tracer), with the reports it printed there."""
    with open(FIXTURES / "tracer_gpt2_tiny.pickle", "rb") as f:
        recorded = pickle.load(f)
    result = trace.load(recorded["snapshot"], paths="full")  # the paths as printed there
    assert result.text() == recorded["text"]
    # Since issue 20 a phase with no module says so ("backward:" there is
    # "backward:(no module)" here); nothing else differs.
    no_module = r"\1:(no module)"
    assert result.module_text() == re.sub(
        r"(?<=  )(forward|backward|optimizer):$", no_module, recorded["module_text"], flags=re.M
    )
    assert result.to_json() == re.sub(
        r'(?<="key":")(forward|backward|optimizer):(?=")', no_module, recorded["json"]
    )
    assert "backward:(no module)" in [r.location for r in result.module_rows(0)]
    assert result.max_mem("cuda:0") == recorded["facts"]["peak_allocated"]
    assert result.notices("cuda:0") == []
    modules = [r.location for r in result.module_rows(0)]
    assert "forward:transformer.h.0.attn.c_attn" in modules
    assert "optimizer:AdamW" in modules


def test_jupyter_html_is_a_table_per_view_with_exact_bytes():
    from html.parser import HTMLParser

    snapshot, facts = fixture("gpt2_tiny")
    result = trace.load(as_recorded(snapshot, facts))

    class Cells(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tables, self.titles, self.text = 0, [], []

        def handle_starttag(self, tag, attrs):
            self.tables += tag == "table"
            self.titles += [v for k, v in attrs if k == "title"]

        def handle_data(self, data):
            self.text.append(data)

    parser = Cells()
    parser.feed(result._repr_html_())
    assert parser.tables >= 1
    row_bytes = [int(t.split()[0]) for t in parser.titles if t.endswith(" bytes")]
    assert row_bytes[: len(result.rows(0))] == [r.bytes for r in result.rows(0)]
    assert f"{facts['peak_allocated']} bytes" in "".join(parser.text)


# -- exclude and keyword groups: one string is one entry ------------------------------------
def cdist_step():
    a, b = torch.randn(300, 8), torch.randn(200, 8)
    return torch.cdist(a, b)  # allocated inside torch/functional.py


def test_exclude_as_one_string_skips_torchs_frames_not_its_letters():
    assert "torch" not in __file__, "this test needs a file path without 'torch' in it"
    with trace.Tracer(device="cpu", exclude="torch") as tr:
        out = cdist_step()
    locations = [r.location for r in tr.result.rows("cpu")]
    assert not any("functional.py" in loc for loc in locations), locations
    here = f"{as_shown(__file__)}:{line_of(cdist_step, 'torch.cdist')} (cdist_step)"
    assert here in locations
    assert tr.exclude == ["torch"]
    assert tr.result.exclude == ["torch"]
    del out


def _two_frame_history(library, user):
    """A CPU history of one allocation made in `library` called from `user`."""
    frames = [
        {"filename": library, "line": 7, "name": "lib"},
        {"filename": user, "line": 3, "name": "main"},
    ]
    entry = {
        "action": "alloc",
        "addr": 4096,
        "size": 1024,
        "stream": 0,
        "time_us": 1,
        "frames": frames,
        "user_metadata": "",
    }
    return {
        "segments": [],
        "device_traces": [[entry]],
        "memlab_rs": {"version": 1, "source": "cpu", "start": {"time_us": 0, "live": []}},
    }


_PART = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=2, max_size=12)


@settings(max_examples=60, deadline=None)
@given(part=_PART, user=_PART)
def test_a_string_exclude_is_one_path_part_wherever_it_is_given(part, user):
    library = f"/opt/env/{part}/ops.py"
    user_file = f"/home/u/{user}.py"
    assume(part not in user_file)
    snapshot = _two_frame_history(library, user_file)
    as_list = trace.load(snapshot, exclude=[part]).rows("cpu")
    assert [r.location for r in as_list] == [f"{user_file}:3 (main)"]
    assert trace.load(snapshot, exclude=part).rows("cpu") == as_list
    assert trace.TraceResult(snapshot, exclude=part).rows("cpu") == as_list
    assert trace.Tracer(device="cpu", exclude=part).exclude == [part]


def test_bad_exclude_names_the_parameter():
    snapshot = _two_frame_history("/a/lib.py", "/b/user.py")
    with pytest.raises(TypeError, match=r"exclude\[1\]=3: each path part must be a str"):
        trace.load(snapshot, exclude=["torch/", 3])
    with pytest.raises(TypeError, match="exclude=b'torch': give path parts as a list of str"):
        trace.Tracer(device="cpu", exclude=b"torch")
    with pytest.raises(TypeError, match="exclude=5: give path parts"):
        trace.TraceResult(snapshot, exclude=5)
    with pytest.raises(ValueError, match=r"exclude\[0\] is an empty string"):
        trace.load(snapshot, exclude="")


def test_a_keyword_given_as_one_string_is_one_keyword():
    snapshot, facts = fixture("mlp_adam")
    result = trace.load(as_recorded(snapshot, facts))
    listed = result.keywords({"first": ["step0"], "later": ["step1", "step2"]}, None)
    assert result.keywords({"first": "step0", "later": ["step1", "step2"]}, None) == listed
    assert dict(listed)["first"] > 0
    # Its letters would have matched every tag ("s", "t", "e", "p", "0").
    assert dict(listed)["Others"] > 0
    with pytest.raises(TypeError, match="groups must be a dict of a group's name to its keywords"):
        result.keywords([("first", ["step0"])], None)
    with pytest.raises(TypeError, match=r"groups\['first'\]: the keyword 0 must be a str"):
        result.keywords({"first": [0]}, None)
    with pytest.raises(ValueError, match=r"groups\['first'\] has an empty keyword"):
        result.keywords({"first": ""}, None)


def test_every_rendering_is_one_render_of_the_analysis(tmp_path):
    """The trace renders through the result base's render(format, **view), from the analysis
    Rust keeps: each of text, the module view, HTML, JSON, CSV and the untagged log is one
    format of it, and a view option a format does not take is named."""
    snapshot, facts = fixture("mlp_adam")
    result = trace.load(as_recorded(snapshot, facts))
    assert result.render() == result.text() == str(result)
    assert result.text().startswith("Max mem: ")
    assert result.render("text", by="module") == result.module_text()
    assert result.module_text().splitlines()[1] == "Mem, Cumulative Mem, Median, Count, Module"
    assert result.render("html") == result.html() == result._repr_html_()
    assert result.render("json") == result.to_json()
    assert json.loads(result.render("json"))["devices"][0]["max_mem"] == result.max_mem()
    assert result.render("csv", device="cuda:0") == result.to_csv() == result.to_csv(device=0)
    assert result.render("untagged_log") == result.untagged_log(device="cuda:0")
    with pytest.raises(ValueError, match=r"format='png': a trace result renders as text, html"):
        result.render("png")
    with pytest.raises(ValueError, match="by must be 'location' or 'module', got 'line'"):
        result.render("text", by="line")
    with pytest.raises(TypeError, match="by must be 'location' or 'module', got 1"):
        result.render("text", by=1)
    with pytest.raises(ValueError, match='format="html" takes no by view option'):
        result.render("html", by="module")
    with pytest.raises(ValueError, match="unknown field `columns`"):
        result.render("text", columns=["peak"])
    # What it saves is the text Rust does not hold: the snapshot, each frame and stack once.
    assert json.loads(result.data_json()) == result.to_data()
    result.save(tmp_path / "t.json")
    assert trace.load(tmp_path / "t.json").render("text", by="module") == result.module_text()
