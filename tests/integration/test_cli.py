"""The `memlab-rs` command line end to end: run (a script using @profile unmodified, --line,
-m, exit statuses), show in every format, diff, merge, and bad input giving one line on
stderr and a non-zero status, on results that `memlab-rs run` saved.

`run` goes through the installed console script, in a process of its own: it runs the
script as that process's __main__ and exits with its status. `show`, `diff` and `merge` of
what the runs saved call `memlab_rs.cli.main`, the function the console script calls, in
this interpreter (`cli_in_process`): a process each costs an import of torch. One `show`
still goes through the console script, and one `run` through `python -m memlab_rs`, for the
entry points. What needs no process at all (help, the other kinds shown, run's errors found
before a script is looked at) is in tests/unit/cli."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_in_process import cli_in_process, one_line_error
from console_script import MEMLAB_RS

import memlab_rs

MiB = 1 << 20

# A script written for `@profile` without importing it, as kernprof's users write them.
SCRIPT = """\
import sys
import torch


@profile
def step(n):
    a = torch.zeros(n, 1024)
    b = torch.ones(2 * n, 1024)
    del a
    return b


def helper():
    x = torch.empty(1024, 1024)
    return x


class Model:
    def forward(self):
        def inner():
            return torch.zeros(128, 1024)

        return inner()


if __name__ == "__main__":
    print("argv", sys.argv[1:], __name__)
    step(int(sys.argv[1]))
    helper()
    Model().forward()
    sys.exit(int(sys.argv[2]))
"""


# `python -m memlab_rs`, for ``program``.
PYTHON_M = (sys.executable, "-m", "memlab_rs")


def start(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    device: str | None = "cpu",
    program: tuple[str, ...] = (str(MEMLAB_RS),),
) -> subprocess.Popen:
    """Start the installed console script (or ``program``) without waiting for it, so that
    runs that do not depend on each other share the cores; ``finish`` waits. `run` reads
    ``device`` (the CPU by default: the tests measure CPU tensors, and on a GPU machine the
    default would be the GPU; None leaves the default)."""
    if args[:1] == ("run",) and device is not None:
        args = ("run", "--device", device, *args[1:])
    return subprocess.Popen(
        [*program, *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def finish(*procs: subprocess.Popen, timeout: float = 180) -> list[subprocess.CompletedProcess]:
    """Wait for processes ``start`` started: the completed processes, in that order (those
    still running are killed when one times out)."""
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
        return [
            subprocess.CompletedProcess(p.args, p.returncode, *o) for p, o in zip(procs, outputs)
        ]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()


def cli(*args: str, cwd: Path, timeout: float = 180, **options) -> subprocess.CompletedProcess:
    """Run the installed console script (``start``'s options); the completed process."""
    (proc,) = finish(start(*args, cwd=cwd, **options), timeout=timeout)
    return proc


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(SCRIPT)
    return tmp_path


def saved(folder: Path, pattern: str = "memlab_rs.*.json") -> list[Path]:
    return sorted(folder.glob(pattern))


@pytest.fixture(scope="module")
def in_process_records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """The functions of train.py profiled in a fresh interpreter by LineProfiler itself:
    {function: records}, every saved column (once per module: records name no file)."""
    folder = tmp_path_factory.mktemp("in_process")
    (folder / "train.py").write_text(SCRIPT)
    code = f"""
        import importlib.util, json, sys
        import memlab_rs
        spec = importlib.util.spec_from_file_location("train", {str(folder / "train.py")!r})
        module = importlib.util.module_from_spec(spec)
        module.profile = lambda f: f  # the decorator is the profiler's business here
        spec.loader.exec_module(module)
        with memlab_rs.LineProfiler(
            module.step, module.helper, module.Model.forward, device="cpu"
        ) as profiler:
            module.step(256)
            module.helper()
            module.Model().forward()
        result = profiler.result()
        print(json.dumps({{f: result.records(f) for f in result.functions}}))
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_run_profile_unmodified_matches_in_process(workdir: Path, in_process_records: dict):
    proc = cli("run", "train.py", "256", "3", cwd=workdir)
    # the script's own argv, __main__, output and exit status
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.startswith("argv ['256', '3'] __main__\n")
    # @profile prints at exit, as it does in-process
    assert "## step\n" in proc.stdout and "b = torch.ones(2 * n, 1024)" in proc.stdout
    (path,) = saved(workdir)
    assert re.fullmatch(r"memlab_rs\.train\.\d+\.json", path.name)
    assert f"line profile saved to {path.name}" in proc.stderr
    result = memlab_rs.load(path)
    assert result.functions == ["step"]
    assert result.meta["argv"] == ["train.py", "256", "3"]
    assert (result.meta["rank"], result.meta["world_size"]) == (0, 1)
    assert result.records("step") == in_process_records["step"]
    lines = {r["code"].strip(): r for r in result.records("step")}
    assert lines["a = torch.zeros(n, 1024)"]["active_bytes.all.peak"] == MiB
    assert lines["b = torch.ones(2 * n, 1024)"]["active_bytes.all.peak"] == 3 * MiB
    assert lines["return b"]["active_bytes.all.current"] == 2 * MiB
    # the report printed at exit is the saved one's text
    assert result.text() in proc.stdout


def test_run_line_profiles_functions_by_qualified_name(workdir: Path, in_process_records: dict):
    proc = cli(
        "run",
        "--line",
        "helper",
        "--line",
        "Model.forward.<locals>.inner",
        "--line",
        "Model.forward",
        "train.py",
        "256",
        "0",
        cwd=workdir,
    )
    assert proc.returncode == 0, proc.stderr
    result = memlab_rs.load(saved(workdir)[0])
    assert set(result.functions) == {
        "step",
        "helper",
        "Model.forward",
        "Model.forward.<locals>.inner",
    }
    for function in ("helper", "Model.forward"):
        assert result.records(function) == in_process_records[function]
    (line,) = [r for r in result.records("helper") if "torch.empty" in r["code"]]
    assert line["allocated_bytes.all.allocated"] == 4 * MiB and line["hits"] == 1
    (line,) = [r for r in result.records("Model.forward.<locals>.inner") if "zeros" in r["code"]]
    assert line["allocated_bytes.all.allocated"] == MiB // 2


def test_run_line_in_another_module(workdir: Path):
    (workdir / "helpers.py").write_text(
        "import torch\n\n\ndef make():\n    return torch.zeros(256, 1024)\n"
    )
    (workdir / "main.py").write_text("import helpers\n\nhelpers.make()\n")
    proc = cli("run", "--line", "helpers:make", "--line", "nowhere:f", "main.py", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert "--line nowhere:f: its module was never imported" in proc.stderr
    result = memlab_rs.load(saved(workdir)[0])
    assert result.functions == ["make"]
    (line,) = [r for r in result.records() if "zeros" in r["code"]]
    assert line["allocated_bytes.all.allocated"] == MiB and line["hits"] == 1


def test_run_unknown_line_fails_before_the_script_runs(workdir: Path):
    proc = cli("run", "--line", "stepp", "train.py", "256", "0", cwd=workdir)
    line = one_line_error(proc, "run")
    assert "train.py defines no function 'stepp'" in line
    assert "step, helper, Model.forward, Model.forward.<locals>.inner" in line
    assert proc.stdout == "" and not saved(workdir)


def test_run_module_and_options_after_the_script(workdir: Path):
    (workdir / "pkg").mkdir()
    (workdir / "pkg" / "__init__.py").write_text("")
    (workdir / "pkg" / "__main__.py").write_text(
        "import sys\nfrom . import tool\nprint(sys.argv[1:], __name__, __package__)\ntool.run()\n"
    )
    (workdir / "pkg" / "tool.py").write_text(
        "import torch\n\n\n@profile\ndef run():\n    return torch.zeros(64, 1024)\n"
    )
    # --line and -o after the module are the module's arguments, not ours
    proc = cli("run", "-o", "out.json", "-m", "pkg", "--line", "x", "-o", "y", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("['--line', 'x', '-o', 'y'] __main__ pkg\n")
    assert memlab_rs.load(workdir / "out.json").functions == ["run"]


def test_run_demo_module_gives_the_demo_output_and_the_in_process_profile(workdir: Path):
    """`memlab-rs run -m memlab_rs.demo` prints what `python -m memlab_rs.demo` prints
    (its own in-process LineProfiler report included), and --line train_step records the
    same lines and bytes as LineProfiler(train_step) around the demo in-process. The demo
    itself (`make demo`) prints no warning, and each of its tools' blocks."""
    code = """
        import sys, memlab_rs
        from memlab_rs import demo
        with memlab_rs.LineProfiler(demo.train_step, device="cpu") as profiler:
            demo.main(["--steps", "1", "--device", "cpu"])
        profiler.result().save("inproc.json")
    """
    demo = ("-m", "memlab_rs.demo", "--steps", "1", "--device", "cpu")
    inproc, proc = finish(  # the two interpreters at once
        start(
            "-c", textwrap.dedent(code), cwd=workdir, program=(sys.executable, "-W", "default")
        ),
        start("run", "--line", "train_step", "-o", "cli.json", *demo, cwd=workdir),
        timeout=300,
    )
    assert inproc.returncode == 0, inproc.stderr
    assert inproc.stderr == ""  # no warning, with Python's default filters
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == inproc.stdout
    out = proc.stdout
    assert out.startswith("memlab_rs demo: TinyGPT trained 1 steps on cpu")
    assert "wte.weight+lm_head.weight" in out  # the tied weight, under both names
    assert "## train_step" in out and "## Block.forward" in out
    # The monitor's block for the bundled model, the tracker's diff, the estimate's table.
    assert "Memory Usage for Iteration 2 of Epoch 1" in out
    assert "  wte.weight+lm_head.weight grad" in out
    assert "+ | 1 * Size:(8, 64, 1000)        | Memory: 1.9531 M" in out
    assert "Model TinyGPT : params: 3.750912M" in out
    assert "== LineProfiler: one more step, line by line" in out
    ours, theirs = memlab_rs.load(workdir / "cli.json"), memlab_rs.load(workdir / "inproc.json")
    assert ours.functions == theirs.functions == ["train_step"]
    assert ours.records() == theirs.records()
    assert max(r["hits"] or 0 for r in ours.records()) >= 5  # every step of the demo


def test_run_exit_statuses_and_uncaught_exceptions(workdir: Path):
    (workdir / "fail.py").write_text(
        "import torch\n\n\n@profile\ndef f():\n    x = torch.zeros(256, 1024)\n"
        "    raise RuntimeError('boom')\n\n\nf()\n"
    )
    (workdir / "message.py").write_text("import sys\nsys.exit('stopped: bad input')\n")
    proc, message = finish(
        start("run", "fail.py", cwd=workdir), start("run", "-q", "message.py", cwd=workdir)
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("Traceback (most recent call last):\n")
    assert 'fail.py", line 10, in <module>' in proc.stderr
    assert "RuntimeError: boom" in proc.stderr
    assert "_runner.py" not in proc.stderr  # the traceback starts in the script
    (path,) = saved(workdir)  # what was profiled is saved all the same
    (line,) = [r for r in memlab_rs.load(path).records() if "zeros" in r["code"]]
    assert line["allocated_bytes.all.allocated"] == MiB
    assert (message.returncode, message.stderr) == (1, "stopped: bad input\n")


def test_run_output_names_carry_rank_and_kind(workdir: Path):
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    template = "{stem}-{rank}of{world_size}.json"
    proc, gz, placeholders = finish(  # three runs at once: each writes names of its own
        start("run", "--trace", "train.py", "256", "0", cwd=workdir, env=env),
        start("run", "-q", "-o", "out.json.gz", "train.py", "256", "0", cwd=workdir, env=env),
        start("run", "-o", template, "train.py", "64", "0", cwd=workdir, env=env),
    )
    assert proc.returncode == 0, proc.stderr
    pid = saved(workdir)[0].name.split(".")[2]
    assert [p.name for p in saved(workdir, "memlab_rs.*")] == [
        f"memlab_rs.train.{pid}.rank1.json",
        f"memlab_rs.train.{pid}.rank1.trace.json",
    ]
    result = memlab_rs.load(saved(workdir)[0])
    assert (result.meta["rank"], result.meta["world_size"]) == (1, 2)
    assert result.text().startswith("# rank 1 of 2 (cpu on ")
    trace = memlab_rs.load(workdir / f"memlab_rs.train.{pid}.rank1.trace.json")
    assert trace.kind == "trace" and (trace.meta["rank"], trace.meta["world_size"]) == (1, 2)
    assert trace.max_mem("cpu") >= 3 * MiB
    shown = cli_in_process("show", f"memlab_rs.train.{pid}.rank1.trace.json", cwd=workdir)
    assert shown.returncode == 0 and shown.stdout == trace.text()
    # a snapshot pickle (TraceResult.save("x.pickle")) shows too
    trace.save(workdir / "snapshot.pickle")
    shown = cli_in_process("show", "snapshot.pickle", "--format", "csv", cwd=workdir)
    assert shown.returncode == 0 and shown.stdout == trace.to_csv()
    # -o: placeholders, .gz, and the rank inserted when the name has none
    assert gz.returncode == 0 and gz.stderr == ""
    assert memlab_rs.load(workdir / "out.rank1.json.gz").functions == ["step"]
    assert placeholders.returncode == 0, placeholders.stderr
    assert memlab_rs.load(workdir / "train-1of2.json").meta["rank"] == 1


def test_run_says_when_nothing_was_profiled(tmp_path: Path):
    (tmp_path / "plain.py").write_text("print('hello')\n")
    proc = cli("run", "plain.py", cwd=tmp_path, program=PYTHON_M)  # python -m memlab_rs, too
    assert (proc.returncode, proc.stdout) == (0, "hello\n")
    assert "memlab_rs: nothing was profiled" in proc.stderr
    assert not saved(tmp_path)


def test_run_of_a_missing_module_is_one_line(workdir: Path):
    # -m sets sys.path[0] (as python -m does) before it looks the module up: a process
    # (the errors found before that are in tests/unit/cli, in process)
    assert "no module named 'no_such_module'" in one_line_error(
        cli("run", "-m", "no_such_module", cwd=workdir), "run"
    )


@pytest.fixture(scope="module")
def saved_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a.json and b.json: train.py run with 256 and 512 (once per module)."""
    folder = tmp_path_factory.mktemp("two_runs")
    (folder / "train.py").write_text(SCRIPT)
    for proc in finish(
        start("run", "-q", "-o", "a.json", "train.py", "256", "0", cwd=folder),
        start("run", "-q", "-o", "b.json", "train.py", "512", "0", cwd=folder),
    ):
        assert proc.returncode == 0, proc.stderr
    return folder


@pytest.fixture
def two_runs(saved_runs: Path, tmp_path: Path) -> tuple[Path, Path]:
    """a.json and b.json (``saved_runs``) copied to this test's own folder."""
    for name in ("train.py", "a.json", "b.json"):
        shutil.copy(saved_runs / name, tmp_path / name)
    return tmp_path / "a.json", tmp_path / "b.json"


def test_show_every_format(two_runs: tuple[Path, Path]):
    path, _ = two_runs
    folder = path.parent
    result = memlab_rs.load(path)
    text = cli("show", "a.json", cwd=folder)  # the console script, end to end
    assert (text.returncode, text.stdout, text.stderr) == (0, result.text(), "")
    same = cli_in_process("show", "a.json", cwd=folder)
    assert (same.returncode, same.stdout, same.stderr) == (0, result.text(), "")
    columns = ["allocated_bytes.all.allocated", "active_bytes.all.current"]
    chosen = cli_in_process(
        "show", "a.json", "--columns", ",".join(columns), "--func", "step", cwd=folder
    )
    assert chosen.stdout == result.text("step", columns)
    every = cli_in_process("show", "a.json", "--columns", "all", cwd=folder)
    assert every.stdout == result.text(columns=None)
    html = cli_in_process("show", "a.json", "--format", "html", cwd=folder)
    assert html.stdout == result.html() + "\n" and "<table" in html.stdout
    document = json.loads(cli_in_process("show", "a.json", "--format", "json", cwd=folder).stdout)
    assert document["kind"] == "line_profile" and document["data"] == result.to_data()
    rows = list(
        csv.DictReader(
            io.StringIO(cli_in_process("show", "a.json", "--format", "csv", cwd=folder).stdout)
        )
    )
    (line,) = [r for r in rows if "torch.ones" in r["code"]]
    assert int(line["allocated_bytes.all.allocated"]) == 2 * MiB
    cli_in_process("show", "a.json", "-o", "a.txt", cwd=folder)
    assert (folder / "a.txt").read_text() == result.text()


def test_show_bad_input_is_one_line(two_runs: tuple[Path, Path]):
    folder = two_runs[0].parent
    line = one_line_error(
        cli_in_process("show", "a.json", "--columns", "active_bytes.all.peek", cwd=folder), "show"
    )
    assert "unknown column 'active_bytes.all.peek'" in line
    assert "did you mean 'active_bytes.all.peak'" in line and "allocated_bytes.all.freed" in line
    line = one_line_error(cli_in_process("show", "a.json", "--func", "nope", cwd=folder), "show")
    assert "no function 'nope' in this line profile (it has: step)" in line
    (folder / "notes.txt").write_text("not a result\n")
    line = one_line_error(cli_in_process("show", "notes.txt", cwd=folder), "show")
    assert "notes.txt: not a memlab_rs result file" in line
    (folder / "other.json").write_text('{"format": "something else"}')
    assert "not a memlab_rs result file" in one_line_error(
        cli_in_process("show", "other.json", cwd=folder), "show"
    )
    assert "missing.json: no such file" in one_line_error(
        cli_in_process("show", "missing.json", cwd=folder), "show"
    )
    proc = cli_in_process("show", "a.json", "--format", "pdf", cwd=folder)
    assert proc.returncode == 2 and "invalid choice: 'pdf'" in proc.stderr


def test_diff_line_profiles(two_runs: tuple[Path, Path]):
    folder = two_runs[0].parent
    proc = cli_in_process(
        "diff", "a.json", "b.json", "--columns", "allocated_bytes.all.allocated", cwd=folder
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# line profile diff: a.json -> b.json\n")
    assert (
        "## allocated_bytes.all.allocated: 2 lines grew (the most +2.00M at step:8), 0 shrank\n"
        "highest line of step: 2.00M -> 4.00M (+2.00M)\n"
    ) in proc.stdout
    grew = proc.stdout.split("grew:\n")[1].splitlines()
    assert grew[0].split() == ["+2.00M", "step:8", "b", "=", "torch.ones(2", "*", "n,", "1024)",
                               "(2.00M", "->", "4.00M)"]  # fmt: skip
    assert grew[1].split()[:2] == ["+1.00M", "step:7"]
    data = json.loads(
        cli_in_process(
            "diff", "a.json", "b.json", "--format", "json", "--columns", "all", cwd=folder
        ).stdout
    )
    (row,) = [r for r in data["rows"] if r["column"] == "active_bytes.all.peak" and r["line"] == 8]
    assert (row["a"], row["b"], row["change"]) == (3 * MiB, 6 * MiB, 3 * MiB)
    (peak,) = [t for t in data["totals"] if t["column"] == "active_bytes.all.peak"]
    assert peak["largest_growth"] == {"function": "step", "line": 8, "change": 3 * MiB}
    step = {"function": "step", "a": 3 * MiB, "b": 6 * MiB, "change": 3 * MiB}
    assert peak["functions"] == [step]
    assert "grew_bytes" not in peak  # a sum of peaks of different lines: meaningless
    # a regression gate: status 1 when a line grew by more than the limit
    gate = cli_in_process("diff", "a.json", "b.json", "--fail-over", "2.5M", cwd=folder)
    assert gate.returncode == 1
    assert gate.stderr == (
        "memlab-rs diff: 2 lines grew by more than 2.50M; the largest +3.00M at step:8 "
        "(active_bytes.all.peak)\n"  # lines 8 and 9, each in both default columns
    )
    assert (
        cli_in_process("diff", "a.json", "b.json", "--fail-over", "3M", cwd=folder).returncode == 0
    )
    same = cli_in_process("diff", "a.json", "a.json", cwd=folder)
    assert same.returncode == 0
    assert "## active_bytes.all.peak: 0 lines grew, 0 shrank\npeak of step: 3.00M -> 3.00M\n" in (
        same.stdout
    )


def test_diff_and_merge_bad_input(two_runs: tuple[Path, Path]):
    folder = two_runs[0].parent
    line = one_line_error(cli_in_process("merge", "a.json", "b.json", cwd=folder), "merge")
    assert "a.json and b.json are both rank 0" in line
    line = one_line_error(cli_in_process("diff", "a.json", "missing.json", cwd=folder), "diff")
    assert "missing.json" in line
    line = one_line_error(
        cli_in_process("diff", "a.json", "b.json", "--columns", "bogus", cwd=folder), "diff"
    )
    assert "unknown column 'bogus'" in line
    proc = cli_in_process("diff", "a.json", "b.json", "--fail-over", "lots", cwd=folder)
    assert proc.returncode == 2 and "'lots' is not a size" in proc.stderr


def test_diff_fail_over_reads_a_size_as_every_size_is_read(two_runs: tuple[Path, Path]):
    """--fail-over 2MB is 2,000,000 bytes, as parse_size and the pytest markers read it (it
    was 2 MiB); 2M and 2MiB are 2 MiB; a 400-digit size is a usage error (it was an
    OverflowError, status 1)."""
    from memlab_rs import parse_size

    folder = two_runs[0].parent
    rows = json.loads(cli_in_process("diff", "a.json", "b.json", "--format", "json", cwd=folder)
                      .stdout)["rows"]  # fmt: skip
    # The gate counts lines, a line grown in two columns once (issue 20, item 13).
    over_mb = len({(r["function"], r["line"]) for r in rows if r["change"] > 2_000_000})
    over_mib = len({(r["function"], r["line"]) for r in rows if r["change"] > 2 << 20})
    assert over_mb > over_mib > 0  # lines that grew by exactly 2 MiB tell them apart

    def lines(n):
        return f"{n} line{'' if n == 1 else 's'}"

    gate = cli_in_process("diff", "a.json", "b.json", "--fail-over", "2MB", cwd=folder)
    assert parse_size("2MB") == 2_000_000
    assert gate.returncode == 1
    assert gate.stderr.startswith(f"memlab-rs diff: {lines(over_mb)} grew by more than 1.91M;")
    for mib in ("2M", "2MiB", "2 mib", str(2 << 20)):
        gate = cli_in_process("diff", "a.json", "b.json", "--fail-over", mib, cwd=folder)
        assert gate.returncode == 1
        assert gate.stderr.startswith(f"memlab-rs diff: {lines(over_mib)} grew by more than 2.00M;")
    huge = cli_in_process("diff", "a.json", "b.json", "--fail-over", "9" * 400, cwd=folder)
    assert huge.returncode == 2
    assert "argument --fail-over: " in huge.stderr
    assert "is not a size: it is more than 18446744073709551615 bytes" in huge.stderr


def test_merge_line_profiles_of_two_ranks(workdir: Path):
    """Two ranks (torchrun's environment, no process group): rank 1 works on twice the
    data; merge shows each line's min, median and max and that rank 1 holds the max."""
    started = []
    for rank, n in ((0, 256), (1, 512)):  # at once, as torchrun starts them
        env = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank)}
        run = ("run", "-q", "-o", "r.json", "train.py", str(n), "0")
        started.append(start(*run, cwd=workdir, env=env))
    for proc in finish(*started):
        assert proc.returncode == 0, proc.stderr
    proc = cli_in_process("merge", "r.rank1.json", "r.rank0.json", "-o", "merged.json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    merged = memlab_rs.load(workdir / "merged.json")
    assert merged.kind == "merged_line_profile" and proc.stdout == merged.text()
    assert merged.ranks == [0, 1] and merged.world_size == 2
    assert proc.stdout.startswith("# merged line profile: ranks 0, 1 of 2\n\n## step\n")
    (row,) = [r for r in merged.records() if "torch.ones" in r["code"]]
    column = "allocated_bytes.all.allocated"
    assert (row[f"{column}.rank0"], row[f"{column}.rank1"]) == (2 * MiB, 4 * MiB)
    assert (row[f"{column}.min"], row[f"{column}.median"], row[f"{column}.max"]) == (
        2 * MiB,
        3 * MiB,
        4 * MiB,
    )
    assert row[f"{column}.max_rank"] == 1
    # the text: min, median, max, and the rank holding the max where the ranks differ
    (text_line,) = [ln for ln in proc.stdout.splitlines() if "torch.ones" in ln]
    assert text_line.split()[:9] == ["3.00M", "4.50M", "6.00M", "1", "3.00M", "4.50M", "6.00M",
                                     "1", "8"]  # fmt: skip
    (first,) = [ln for ln in proc.stdout.splitlines() if ln.endswith("@profile")]
    assert first.split() == ["0.00B", "0.00B", "0.00B", "-"] * 2 + ["5", "1", "@profile"]
    for fmt in ("html", "json", "csv"):
        out = cli_in_process("merge", "r.rank0.json", "r.rank1.json", "--format", fmt, cwd=workdir)
        assert out.returncode == 0, out.stderr
    csv_rows = list(csv.DictReader(io.StringIO(out.stdout)))
    (line,) = [r for r in csv_rows if "torch.ones" in r["code"]]
    assert int(line[f"{column}.rank1"]) == 4 * MiB
    shown = cli_in_process("show", "merged.json", "--columns", column, cwd=workdir)
    assert shown.stdout == merged.text(columns=[column])


REPORT_SCRIPT = """\
import sys
import torch

model = torch.nn.Linear(256, 256)
cache = torch.zeros(int(sys.argv[1]), 1024)
"""


def test_report_show_and_diff_tensor_reports(tmp_path: Path):
    """--report names the script's globals; show renders the saved report; diff says
    which tensor grew, by exactly how much, and gates on it."""
    (tmp_path / "hold.py").write_text(REPORT_SCRIPT)
    runs = finish(
        start("run", "--report", "-o", "a.json", "hold.py", "256", cwd=tmp_path),
        start("run", "--report", "-o", "b.json", "hold.py", "512", cwd=tmp_path),
    )
    for name, proc in zip("ab", runs):
        assert proc.returncode == 0, proc.stderr
        assert f"tensor report saved to {name}.tensor_report.json" in proc.stderr
    report = memlab_rs.load(tmp_path / "a.tensor_report.json")
    rows = {r.name: r for r in report.rows}
    assert rows["model.weight"].bytes == 256 * 256 * 4 and rows["model.bias"].bytes == 1024
    assert (rows["cache"].bytes, rows["cache"].shape) == (MiB, (256, 1024))
    shown = cli_in_process("show", "a.tensor_report.json", cwd=tmp_path)
    assert (shown.returncode, shown.stdout) == (0, report.to_text())
    html = cli_in_process("show", "a.tensor_report.json", "--format", "html", cwd=tmp_path)
    assert html.stdout == report._repr_html_() + "\n"
    document = json.loads(
        cli_in_process("show", "a.tensor_report.json", "--format", "json", cwd=tmp_path).stdout
    )
    assert document["kind"] == "tensor_report"
    line = one_line_error(
        cli_in_process("show", "a.tensor_report.json", "--format", "csv", cwd=tmp_path), "show"
    )
    assert "a tensor_report has no CSV form" in line
    line = one_line_error(
        cli_in_process("show", "a.tensor_report.json", "--columns", "x", cwd=tmp_path), "show"
    )
    assert "--columns and --func apply to line profiles" in line

    proc = cli_in_process("diff", "a.tensor_report.json", "b.tensor_report.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "# tensor report diff: a.tensor_report.json -> b.tensor_report.json"
    total = 256 * 256 * 4 + 1024 + MiB
    assert lines[2] == (
        f"## cpu: {memlab_rs.readable_size(total)} -> {memlab_rs.readable_size(total + MiB)} "
        "(+1.00M)"
    )
    assert lines[3:] == [
        "grew:",
        "      +1.00M  cache  (512, 1024) torch.float32  (1.00M -> 2.00M)",
    ]
    a, b = "a.tensor_report.json", "b.tensor_report.json"
    data = json.loads(cli_in_process("diff", a, b, "--format", "json", cwd=tmp_path).stdout)
    assert data["rows"] == [
        {
            "name": "cache",
            "device": "cpu",
            "shape": "(512, 1024)",
            "dtype": "torch.float32",
            "a": MiB,
            "b": 2 * MiB,
            "change": MiB,
        }
    ]
    gate = cli_in_process("diff", a, b, "--fail-over", "512K", cwd=tmp_path)
    assert gate.returncode == 1
    assert (
        gate.stderr
        == "memlab-rs diff: 1 tensor grew by more than 512.00K; the largest +1.00M at cache (cpu)\n"
    )
    memlab_rs.LineProfiler(device="cpu").result().save(tmp_path / "lines.json")
    line = one_line_error(
        cli_in_process("diff", "lines.json", "a.tensor_report.json", cwd=tmp_path), "diff"
    )
    assert "lines.json is a line_profile and a.tensor_report.json a tensor_report" in line
