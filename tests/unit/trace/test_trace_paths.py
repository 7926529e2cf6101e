"""How a trace shows files: short by default (an installed package's file from its package
down, a file under the recording's working directory relative to it, any other in full),
full on request; and the README and the guide quote exactly what the code prints."""

from __future__ import annotations

import importlib.util
import os
import pickle
import re

import paths
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from paths import ROOT

from memlab_rs import trace

FIXTURES = paths.FIXTURES / "trace"


# -- the README and the guide ---------------------------------------------------------------
def quoted_reports(path):
    """The ```text blocks of a markdown file that quote a trace table, without the "..."
    that stands for the rows left out."""
    blocks = re.findall(r"```text\n(.*?)```", path.read_text(), flags=re.S)
    out = []
    for block in blocks:
        lines = block.splitlines()
        if any(line.startswith("Mem, Cumulative Mem, Median, Count, ") for line in lines):
            out.append([line for line in lines if line != "..."])
    return out


def test_the_readme_and_the_guide_quote_what_the_code_prints():
    """tracer_gpt2_tiny.pickle: the GPT-2 run both documents quote, recorded by the Tracer on
    an H100 from the checkout's root (capture.py's own path in the stacks says where). It
    predates the Tracer saving its working directory, which it would have saved as that."""
    with open(FIXTURES / "tracer_gpt2_tiny.pickle", "rb") as f:
        snapshot = pickle.load(f)["snapshot"]
    capture = "tests/fixtures/trace/capture.py"
    recorded_in = {
        frame["filename"][: -len(capture) - 1]
        for entry in snapshot["device_traces"][0]
        for frame in entry.get("frames") or ()
        if frame["filename"].endswith("/" + capture)
    }
    assert len(recorded_in) == 1, recorded_in
    snapshot["memlab_rs"]["cwd"] = recorded_in.pop()
    result = trace.load(snapshot)
    printed = {"Location": result.text().splitlines(), "Module": result.module_text().splitlines()}
    checked = 0
    for doc in (ROOT / "README.md", ROOT / "docs" / "guide.md"):
        for lines in quoted_reports(doc):
            header = next(line for line in lines if line.startswith("Mem, Cumulative Mem"))
            out = printed[header.rsplit(", ", 1)[1]]
            starts = [i for i in range(len(out)) if out[i : i + len(lines)] == lines]
            assert starts, f"{doc.name} quotes what the code does not print:\n" + "\n".join(lines)
            assert out[starts[0]] in (out[0], header)  # from the top, or from the header
            checked += 1
    assert checked == 3  # README: by location, by module; the guide: by module


# -- short paths on a real recording --------------------------------------------------------
STEPS = """
import torch


def step():
    a = torch.empty(256, 1024)  # 1 MiB, alive at the peak
    b = torch.cdist(torch.randn(300, 8), torch.randn(200, 8))  # made in torch/functional.py
    return a, b
"""


def test_a_recording_shows_packages_from_their_directory_and_files_here_relative(
    tmp_path, monkeypatch
):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "steps.py").write_text(STEPS)
    spec = importlib.util.spec_from_file_location(
        "trace_paths_steps", tmp_path / "models" / "steps.py"
    )
    steps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(steps)
    monkeypatch.chdir(tmp_path)
    with trace.Tracer(device="cpu", exclude=["memlab_rs"]) as tr:
        out = steps.step()
    torch_dir = os.path.dirname(torch.__file__)
    assert "-packages" in torch_dir, "this test needs torch installed in site-packages"
    locations = {r.location for r in tr.result.rows("cpu")}
    assert "models/steps.py:6 (step)" in locations
    assert any(loc.startswith(".../torch/functional.py:") for loc in locations), locations
    assert not any(loc.startswith("/") for loc in locations)
    # In full on request, and the same rows otherwise.
    full = trace.load(tr.result.snapshot, exclude=["memlab_rs"], paths="full")
    assert f"{tmp_path}/models/steps.py:6 (step)" in {r.location for r in full.rows("cpu")}
    assert f"{torch_dir}/functional.py" in full.text()
    assert [(r.bytes, r.count) for r in full.rows("cpu")] == [
        (r.bytes, r.count) for r in tr.result.rows("cpu")
    ]
    # Saved and read from another directory: relative to where it was recorded.
    tr.result.save(tmp_path / "t.pickle")
    tr.result.save(tmp_path / "t.json.gz")
    monkeypatch.chdir(tmp_path.parent)
    for name in ("t.pickle", "t.json.gz"):
        again = trace.load(tmp_path / name, exclude=["memlab_rs"])
        assert again.text() == tr.result.text()
        assert trace.load(tmp_path / name, paths="full").paths == "full"
        assert f"{tmp_path}/models/steps.py" in trace.load(tmp_path / name, paths="full").text()
    del out


def test_the_untagged_log_and_the_timeline_show_the_same_paths():
    frames = [
        {"filename": "/srv/env/lib/python3.12/site-packages/lib/ops.py", "line": 7, "name": "op"},
        {"filename": "/srv/app/train.py", "line": 3, "name": "main"},
    ]
    snapshot = {
        "segments": [],
        "device_traces": [
            [
                {
                    "action": "alloc",
                    "addr": 4096,
                    "size": 1024,
                    "stream": 0,
                    "time_us": 1,
                    "frames": frames,
                    "user_metadata": "",
                },
            ]
        ],
        "memlab_rs": {
            "version": 1,
            "source": "cpu",
            "cwd": "/srv/app",
            "start": {"time_us": 0, "live": []},
        },
    }
    short = trace.load(snapshot, exclude=["lib/ops.py"])
    assert [r.location for r in short.rows("cpu")] == ["train.py:3 (main)"]
    log = short.untagged_log()
    assert "  .../lib/ops.py:7 (op)\n  train.py:3 (main)\n" in log
    assert short.timeline("cpu")["layers"][0][0] == "train.py:3 (main)"
    full = trace.load(snapshot, exclude=["lib/ops.py"], paths="full")
    assert "  /srv/env/lib/python3.12/site-packages/lib/ops.py:7 (op)\n" in full.untagged_log()
    assert full.timeline("cpu")["layers"][0][0] == "/srv/app/train.py:3 (main)"


# -- the rule, on generated paths ----------------------------------------------------------
segment = st.text(alphabet="abcdefghij_.", min_size=1, max_size=6).filter(
    lambda s: s not in (".", "..")
)
folders = st.lists(segment, min_size=1, max_size=4)


def expected(path, cwd):
    """The rule as the guide states it, written again with os.path."""
    for packages in ("/site-packages/", "/dist-packages/"):
        if packages in path:
            return ".../" + path.rsplit(packages, 1)[1]
    if cwd != "/" and os.path.commonpath([path, cwd]) == cwd and path != cwd:
        return os.path.relpath(path, cwd)
    return path


@settings(max_examples=150, deadline=None)
@given(
    cwd=folders,
    inside=st.booleans(),
    packages=st.sampled_from(["", "lib/python3.12/site-packages", "lib/python3/dist-packages"]),
    rest=folders,
    recorded=st.booleans(),
)
def test_short_paths_follow_the_documented_rule(cwd, inside, packages, rest, recorded):
    cwd = "/" + "/".join(cwd)
    base = cwd if inside else "/elsewhere"
    path = "/".join(p for p in (base, packages, *rest) if p) + ".py"
    frames = [{"filename": path, "line": 5, "name": "f"}]
    entry = {
        "action": "alloc",
        "addr": 4096,
        "size": 64,
        "stream": 0,
        "time_us": 1,
        "frames": frames,
        "user_metadata": "",
    }
    ours = {"version": 1, "source": "cpu", "start": {"time_us": 0, "live": []}}
    if recorded:
        ours["cwd"] = cwd
    snapshot = {"segments": [], "device_traces": [[entry]], "memlab_rs": ours}
    if recorded:
        result = trace.load(snapshot, exclude=[])
    else:  # no saved working directory: the reader's
        result = trace.TraceResult(snapshot, exclude=[])
        cwd = os.getcwd()
    (row,) = result.rows("cpu")
    assert row.location == f"{expected(path, cwd)}:5 (f)"
    (row,) = trace.load(snapshot, exclude=[], paths="full").rows("cpu")
    assert row.location == f"{path}:5 (f)"


def test_bad_paths_are_named():
    snapshot = {"segments": [], "device_traces": [[]]}
    for bad in ("relative", "", None, True):
        with pytest.raises(ValueError, match=r"paths=.*use 'short' .* or 'full'"):
            trace.Tracer(device="cpu", paths=bad)
        with pytest.raises(ValueError, match=r"paths=.*use 'short' .* or 'full'"):
            trace.TraceResult(snapshot, paths=bad)
    with pytest.raises(ValueError, match=r"paths='FULL'"):
        trace.load(snapshot, paths="FULL")
