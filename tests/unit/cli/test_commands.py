"""The `memlab-rs` command line in this interpreter, no process started: help and version,
`show` of every kind that needs no run to make, and `run`'s errors found before a script
is looked at. Each goes through `memlab_rs.cli.main`, the function the console script calls
(`cli_in_process`, tests/helpers); what needs `memlab-rs run` to make its results, or a
process of its own, is in tests/integration/test_cli.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from cli_in_process import cli_in_process, one_line_error

import memlab_rs


def test_help_reads_like_the_reference_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("COLUMNS", "80")  # argparse's width, as in a process writing to a pipe
    proc = cli_in_process("--help", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: memlab-rs [-h] [--version] COMMAND ...")
    for command in ("run", "show", "diff", "merge", "examples:", "exit status:"):
        assert command in proc.stdout
    proc = cli_in_process("run", "--help", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: memlab-rs run [options] (script.py | -m module)")
    # Python 3.13's argparse prints "-o, --outfile FILE" where older ones print
    # "-o FILE, --outfile FILE".
    for option in ("--line FUNC", "--report", "--trace", "--outfile FILE", "--device DEV"):
        assert option in proc.stdout
    assert "-m module" in proc.stdout and re.search(r"-o( FILE)?, --outfile", proc.stdout)
    version = cli_in_process("--version", cwd=tmp_path)
    assert (version.returncode, version.stdout) == (0, f"memlab-rs {memlab_rs.__version__}\n")


def test_run_bad_input_is_one_line(tmp_path: Path):
    # found before the script is read or sys.argv and sys.path are set: in process
    # (-m, which sets sys.path[0] first, is in tests/integration/test_cli.py)
    (tmp_path / "train.py").write_text("print('never run')\n")
    assert "can't open file 'missing.py'" in one_line_error(
        cli_in_process("run", "missing.py", cwd=tmp_path), "run"
    )
    (tmp_path / "broken.py").write_text("x = (\n")
    assert "is not valid Python" in one_line_error(
        cli_in_process("run", "broken.py", cwd=tmp_path), "run"
    )
    assert "bad placeholder" in one_line_error(
        cli_in_process("run", "-o", "{oops}.json", "train.py", cwd=tmp_path), "run"
    )
    proc = cli_in_process("run", cwd=tmp_path)
    assert proc.returncode == 2 and "give the script to run" in proc.stderr


def test_show_renders_the_other_kinds(tmp_path: Path, capsys):
    """`show` renders any kind memlab_rs.load reads as the result renders itself (in
    process: the same main() the console script calls)."""
    from memlab_rs import cli as command_line
    from memlab_rs.models import TinyGPT

    tracker = memlab_rs.MemTracker(path=f"{tmp_path}/", device="cpu")
    tracker.track()
    kept = torch.zeros(256, 1024)
    tracked = tracker.track()
    model = TinyGPT(vocab=64, dim=32, layers=1, heads=4, context=16)
    estimated = memlab_rs.estimate(model, torch.zeros(2, 8, dtype=torch.long), device="cpu")
    for result, name in ((tracked, "tracker.json"), (estimated, "estimate.json.gz")):
        path = str(tmp_path / name)
        result.save(path)
        assert command_line.main(["show", path]) == 0
        assert capsys.readouterr().out == result.text()
        assert command_line.main(["show", path, "--format", "html"]) == 0
        assert capsys.readouterr().out == result._repr_html_() + "\n"
        assert command_line.main(["show", path, "--format", "json"]) == 0
        assert json.loads(capsys.readouterr().out)["kind"] == result.kind
        assert command_line.main(["show", path, "--format", "csv"]) == 2
        assert f"a {result.kind} has no CSV form" in capsys.readouterr().err
    # a result without an HTML form (a test's memory) shows its text, as Jupyter does
    from memlab_rs import PytestMemoryResult

    measured = {"device": "cpu", "peak_bytes": 1 << 20, "start_bytes": 0, "limit_bytes": None}
    test_memory = PytestMemoryResult(
        "t.py::test_a",
        "passed",
        [{**measured, "rows": [], "notices": []}],
        meta=memlab_rs.results.run_meta("cpu"),
    )
    path = str(tmp_path / "test_memory.json")
    test_memory.save(path)
    assert test_memory._repr_html_() is None
    assert command_line.main(["show", path, "--format", "html"]) == 0
    assert capsys.readouterr().out == test_memory.text()
    assert test_memory.text().startswith("t.py::test_a: passed\ncpu: peak 1,048,576 bytes")
    del kept
