"""The package's front: `import memlab_rs`, `memlab_rs.__version__` and the command line's
help and version import no torch (its import takes seconds; DESIGN: `memlab-rs --help`
imports no torch); every public name still resolves, whichever way it is reached.

Each check of what a fresh interpreter imports runs one (this one has torch already), and
reads `python -X importtime`'s list of every module imported: no timing is asserted."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from console_script import MEMLAB_RS

import memlab_rs


def imported_modules(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``python -X importtime ARGS`` in a fresh interpreter: the process, and every module
    it imported."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *args], capture_output=True, text=True, timeout=120
    )
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    assert "memlab_rs" in modules, proc.stderr  # importtime's list was read
    return proc, modules


def torch_modules(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] == "torch")


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["show", "--help"],
        ["run", "--help"],
        ["diff", "--help"],
        ["merge", "--help"],
    ],  # fmt: skip
    ids=" ".join,
)
def test_the_console_script_answers_help_and_version_without_torch(argv: list[str]):
    proc, modules = imported_modules(str(MEMLAB_RS), *argv)  # the installed console script
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("memlab-rs " if argv == ["--version"] else "usage: memlab-rs")
    assert torch_modules(modules) == []


def test_python_m_memlab_rs_help_imports_no_torch():
    proc, modules = imported_modules("-m", "memlab_rs", "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: memlab-rs"), proc.stderr
    assert torch_modules(modules) == []


def test_import_memlab_rs_and_its_version_import_no_torch():
    code = "import memlab_rs; print(memlab_rs.__version__)"
    proc, modules = imported_modules("-c", code)
    assert (proc.returncode, proc.stdout) == (0, f"{memlab_rs.__version__}\n"), proc.stderr
    assert torch_modules(modules) == []


def test_every_public_name_resolves():
    for name in memlab_rs.__all__:
        assert getattr(memlab_rs, name) is not None, name
    assert set(memlab_rs.__all__) <= set(dir(memlab_rs))
    assert {"results", "trace", "__version__"} <= set(dir(memlab_rs))
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        memlab_rs.no_such_name  # noqa: B018
    assert not hasattr(memlab_rs, "_repr_html_")  # what Jupyter asks of an object it shows


def test_every_way_in_gives_the_public_names_in_a_fresh_interpreter():
    """From nothing imported: `from memlab_rs import *`, attribute access, the
    pytorch_memlab alias, submodules as attributes; a public name that is also a
    submodule's name: `profile` stays the function when the module defining it was imported
    first (`memlab-rs run` imports memlab_rs.line_profiler.global_profiler before the script
    does `from memlab_rs import profile`); no module shadows the function `estimate` (its
    room's package is `estimation`)."""
    code = textwrap.dedent(
        """
        import importlib, inspect, sys
        profile_module = importlib.import_module("memlab_rs.line_profiler.global_profiler")
        estimation = importlib.import_module("memlab_rs.estimation")
        import importlib.util
        assert importlib.util.find_spec("memlab_rs.estimate") is None
        assert importlib.util.find_spec("memlab_rs.profile") is None
        import memlab_rs
        assert memlab_rs.profile is profile_module.profile, memlab_rs.profile
        assert memlab_rs.estimate is estimation.estimate, memlab_rs.estimate
        from memlab_rs import profile, estimate
        assert inspect.isfunction(profile) and inspect.isfunction(estimate)
        names = {}
        exec("from memlab_rs import *", names)
        del names["__builtins__"]
        assert sorted(names) == sorted(memlab_rs.__all__), sorted(names)
        assert all(getattr(memlab_rs, n) is v for n, v in names.items())
        import memlab_rs as pytorch_memlab
        assert pytorch_memlab.LineProfiler is memlab_rs.line_profiler.LineProfiler
        assert pytorch_memlab.MemReporter is memlab_rs.tensor_report.MemReporter
        assert pytorch_memlab.MemReporter is memlab_rs.mem_reporter.MemReporter
        assert memlab_rs.trace.__name__ == "memlab_rs.trace"  # the trace room's front
        assert memlab_rs.trace.Tracer.__module__ == "memlab_rs.trace.tracer"
        assert memlab_rs.load is memlab_rs.results.load
        assert memlab_rs.readable_size(4194304) == "4.00M"
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert (proc.returncode, proc.stdout) == (0, "ok\n"), proc.stderr


def test_the_lazy_table_says_what_the_type_checkers_read():
    """Each public name loads from the module its TYPE_CHECKING import names (the two lists
    of memlab_rs/__init__.py, one for type checkers and one for the lazy loading, never
    drift apart), and every name of __all__ is in both."""
    tree = ast.parse(Path(memlab_rs.__file__).read_text())
    (block,) = [
        n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.dump(n.test)
    ]
    typed, modules = {}, set()
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1, ast.dump(node)
        for alias in node.names:
            if node.module is None:  # from . import results as results: a submodule
                modules.add(alias.name)
            else:
                typed[alias.asname or alias.name] = f".{node.module}"
    assert typed == memlab_rs._HOMES
    assert modules == set(memlab_rs._MODULES)
    assert sorted(memlab_rs.__all__) == sorted(typed)
