"""The repository stands on its own: its documents point only at its own files, the README
starts with the two set-up commands, one version, a licence, the supported CPythons."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
from pathlib import Path

import pytest
from paths import ROOT

import memlab_rs

TEXT_SUFFIXES = {".md", ".py", ".toml", ".txt", ".ipynb", ".rs", ".cfg", ".ini", ".yml"}


def tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        files = [ROOT / line for line in out.splitlines()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an sdist)
        skipped = {".git", ".venv", "target", ".mypy_cache", ".whl"}
        files = [p for p in ROOT.rglob("*") if not skipped & set(p.relative_to(ROOT).parts)]
    names = {"Makefile", "LICENSE"}
    return [p for p in files if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.name in names)]


def test_nothing_points_outside_the_repository():
    outside = re.compile(r"\.\./shared|shared/(GPU|DESIGN|TORCH_MEMORY)\.md|/work/")
    found = []
    for path in tracked_text_files():
        if path == Path(__file__):
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if outside.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


def test_markdown_links_lead_to_files_of_the_repository():
    link = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")
    broken = []
    for path in tracked_text_files():
        if path.suffix != ".md":
            continue
        for target, _ in link.findall(path.read_text()):
            if re.match(r"[a-z]+://|mailto:", target):
                continue
            resolved = (path.parent / target).resolve()
            if not resolved.exists() or ROOT.resolve() not in resolved.parents:
                broken.append(f"{path.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_readme_starts_with_the_two_setup_commands():
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```")[1]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()[1:]]
    assert [c for c in commands if c] == ["make demo", "make test"]
    assert "CPython 3.9 to 3.13" in readme
    assert "3.12+" in readme.split("## LineProfiler")[1].splitlines()[0]


def test_one_version_from_cargo_toml():
    cargo = (ROOT / "Cargo.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', cargo, re.M).group(1)
    assert memlab_rs.__version__ == version
    assert memlab_rs._core.__version__ == version
    assert importlib.metadata.version("memlab_rs") == version
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject
    assert not re.search(r"^version\s*=", pyproject, re.M)


def test_licence_and_classifiers():
    licence = (ROOT / "LICENSE").read_text()
    assert licence.startswith("MIT License")
    assert "Copyright (c) 2026 memlab_rs developers" in licence
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "License :: OSI Approved :: MIT License" in pyproject
    for minor in range(9, 14):
        assert f'"Programming Language :: Python :: 3.{minor}"' in pyproject
    assert 'requires-python = ">=3.9"' in pyproject


@pytest.mark.parametrize(
    "figure", ["1.47x (1.45-1.49)", "2.15x (2.12-2.33)", "5.35x (5.22-7.56)", "7.13x (6.59-7.30)"]
)
def test_the_guide_states_the_tracing_slowdown_below_312(figure):
    """The figures measured with bench/line_profiler_overhead.py --unprofiled-only (the
    guide names the machine); the README quotes their range."""
    cost = (ROOT / "docs" / "guide.md").read_text().split("### Cost")[1].split("\n## ")[0]
    assert figure in cost and "3.12" in cost and "--unprofiled-only" in cost
    readme = (ROOT / "README.md").read_text()
    assert "1.5-2.2x for a tight loop, 2.7-7.1x for call-heavy" in readme


SELECTIONS = (
    "INTERPRETER_SENSITIVE",
    "INTERPRETER_NEUTRAL_UNIT",
    "CONTRACT_ON_BOTH_ENDS",
    "ONCE_ON_THIRD_NEWEST",
    "NEUTRAL_BUT_TORCH_SENSITIVE",
)


def test_the_noxfiles_test_selections_name_files_that_exist():
    """noxfile.py runs some tests on fewer CPythons by path (INTERPRETER_SENSITIVE,
    INTERPRETER_NEUTRAL_UNIT, CONTRACT_ON_BOTH_ENDS, ONCE_ON_THIRD_NEWEST,
    NEUTRAL_BUT_TORCH_SENSITIVE): a path that no longer exists would quietly change what runs
    where (pytest ignores a missing --ignore), so every one must name a test file or folder."""
    import ast

    tree = ast.parse((ROOT / "noxfile.py").read_text())
    lists = {
        target.id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name) and target.id in SELECTIONS
    }
    assert len(lists) == len(SELECTIONS), lists.keys()
    for name, paths in lists.items():
        assert paths, name
        for path in paths:
            assert (ROOT / path).exists(), f"{name} names {path}, which does not exist"
            assert Path(path).name.startswith("test_") or (ROOT / path).is_dir(), path
