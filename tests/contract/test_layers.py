"""The layering checks fail where an arrow points up: import-linter with the contracts of
pyproject.toml (`make lint`'s lint-imports) and .ci/rust_layers.py, each run on a small
throwaway tree that keeps the rules, then on the same tree with one arrow pointing the
wrong way."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest brings tomli on these Pythons
    import tomli as tomllib


def lint_imports() -> str:
    """`make`'s lint-imports: beside this Python, in .venv, or on PATH (it needs Python
    3.11+, so a test session on an older Python runs .venv's)."""
    for folder in (Path(sys.executable).parent, ROOT / ".venv" / "bin"):
        if (folder / "lint-imports").exists():
            return str(folder / "lint-imports")
    found = shutil.which("lint-imports")
    assert found, "lint-imports not found: `make` installs it into .venv (requirements-dev.txt)"
    return found


def write_module(top: Path, name: str, code: str = "") -> None:
    """Module ``name`` (dotted) under ``top``, with ``code`` added; its packages made."""
    parts = name.split(".")
    folder = top.joinpath(*parts[:-1])
    for depth in range(1, len(parts)):
        package = top.joinpath(*parts[:depth])
        package.mkdir(exist_ok=True)
        init = package / "__init__.py"
        if not init.exists():
            if package.with_suffix(".py").exists():  # a module becomes a package
                init.write_text(package.with_suffix(".py").read_text())
                package.with_suffix(".py").unlink()
            else:
                init.write_text("")
    path = folder / f"{parts[-1]}.py"
    if (folder / parts[-1]).is_dir():
        path = folder / parts[-1] / "__init__.py"
    path.write_text((path.read_text() if path.exists() else "") + code)


def concrete(expression: str) -> str:
    """A module an import expression's wildcards match (``a.**`` matches ``a.x``)."""
    return ".".join("x" if part in ("*", "**") else part for part in expression.split("."))


def kept_tree(top: Path, config: dict) -> None:
    """The smallest memlab_rs that keeps the contracts: a module for each layer (optional
    ones too) and each module the layers leave out on purpose, and each import the
    contracts name as allowed (an allowed import that is not there is itself an error)."""
    settings = config["tool"]["importlinter"]
    (root,) = settings["root_packages"]
    (top / root).mkdir()
    (top / root / "__init__.py").write_text("")
    for contract in settings["contracts"]:
        for container in contract.get("containers", [""]):
            prefix = f"{container}." if container else ""
            for layer in contract.get("layers", []):
                for name in re.split(r"[|:]", layer):
                    write_module(top, prefix + name.strip().strip("()"))
            for name in contract.get("exhaustive_ignores", []):
                write_module(top, prefix + name)
        for rule in contract.get("ignore_imports", []):
            importer, imported = (concrete(side.strip()) for side in rule.split("->"))
            write_module(top, importer, f"import {imported}\n")


def run_lint_imports(top: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [lint_imports(), str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=top,
        env={**os.environ, "PYTHONPATH": str(top)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


# (module, the import added to it, what lint-imports says of it)
UP_ARROWS = [
    # a floor importing a room
    ("memlab_rs.results", "memlab_rs.trace", "memlab_rs.results is not allowed to import "
     "memlab_rs.trace"),
    # a room importing the command line
    ("memlab_rs.tracker", "memlab_rs.cli", "memlab_rs.tracker is not allowed to import "
     "memlab_rs.cli"),
    # a floor importing the floor above it
    ("memlab_rs._args", "memlab_rs._torch", "memlab_rs._args is not allowed to import "
     "memlab_rs._torch"),
    # a room importing another room's internals, no feature composing them
    ("memlab_rs.tracker", "memlab_rs.trace._blocks", "memlab_rs.tracker is not allowed to "
     "import memlab_rs.trace"),
    # two modules of one package importing each other
    ("memlab_rs.cli.show", "memlab_rs.cli.main", "No cycles are allowed in memlab_rs.cli"),
]  # fmt: skip


def test_import_linter_keeps_a_tree_that_keeps_the_rules(tmp_path: Path, config: dict):
    kept_tree(tmp_path, config)
    write_module(tmp_path, "memlab_rs.cli.main", "import memlab_rs.cli.show\n")
    proc = run_lint_imports(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "BROKEN" not in proc.stdout and re.search(r"Contracts: \d+ kept, 0 broken", proc.stdout)


@pytest.mark.parametrize(
    "importer, imported, said",
    UP_ARROWS,
    ids=["floor-room", "room-cli", "floor-floor", "room-internals", "circle"],
)
def test_import_linter_reports_an_arrow_pointing_up(
    tmp_path: Path, config: dict, importer: str, imported: str, said: str
):
    kept_tree(tmp_path, config)
    write_module(tmp_path, "memlab_rs.cli.main", "import memlab_rs.cli.show\n")
    write_module(tmp_path, imported)
    write_module(tmp_path, importer, f"import {imported}\n")
    proc = run_lint_imports(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert said in proc.stdout
    assert re.search(r"Contracts: \d+ kept, 1 broken", proc.stdout)


RUST_HOUSE = {
    "lib.rs": "mod text;\nmod allocator;\nmod trace;\nmod tracker;\n",
    "text/mod.rs": "pub fn readable_size() {}\n",
    "allocator/mod.rs": "pub struct Caching;\n",
    "trace/mod.rs": "use crate::allocator::Caching;\npub struct Tracer;\n",
    "tracker/mod.rs": "use crate::text::readable_size;\n",
    "tracker/py.rs": "use pyo3::prelude::*;\n",
}


def rust_layers(src: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "rust_layers.py"), str(src)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def write_crate(src: Path, files: dict[str, str]) -> None:
    for name, code in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(code)


# (file, the line added to it, what rust_layers.py says of it)
RUST_UP_ARROWS = [
    ("text/mod.rs", "use crate::trace::Tracer;",
     "text/mod.rs: a floor (text) uses the room trace (crate::trace)"),
    ("text/mod.rs", "use crate::allocator;",
     "text/mod.rs: the floor text uses allocator, a floor above it (crate::allocator)"),
    ("tracker/mod.rs", "use crate::trace::Tracer;",
     "tracker/mod.rs: a room (tracker) uses the room trace (crate::trace)"),
    ("trace/mod.rs", "use pyo3::prelude::*;",
     "trace/mod.rs: uses pyo3, which only a room's py.rs (or py/) may"),
]  # fmt: skip


def test_rust_layers_keeps_a_crate_that_keeps_the_rules(tmp_path: Path):
    write_crate(tmp_path, RUST_HOUSE)
    proc = rust_layers(tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


@pytest.mark.parametrize(
    "file, line, said", RUST_UP_ARROWS, ids=["floor-room", "floor-floor", "room-room", "pyo3"]
)
def test_rust_layers_reports_an_arrow_pointing_up(tmp_path: Path, file: str, line: str, said: str):
    write_crate(tmp_path, {**RUST_HOUSE, file: RUST_HOUSE[file] + line + "\n"})
    proc = rust_layers(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [f"rust layers: {said}"]
