"""The stubs under python/memlab_rs/_core/ cover every class, function and method of
memlab_rs._core and of each of its submodules (one per room: `_core.<room>` is stubbed by
`_core/<room>.pyi`, the top by `_core/__init__.pyi`).

When the Rust core registers something new, add it to the stub: this test names what is
missing. `python -m mypy.stubtest memlab_rs._core` also checks the signatures.
"""

from __future__ import annotations

import ast
import inspect
import types
from pathlib import Path

import pytest
from paths import ROOT

from memlab_rs import _core

STUBS = ROOT / "python" / "memlab_rs" / "_core"


def _stub(path: Path):
    tree = ast.parse(path.read_text())
    names, classes, exported = set(), {}, None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            classes[node.name] = {
                item.name for item in node.body if isinstance(item, ast.FunctionDef)
            }
        if isinstance(node, ast.ImportFrom) and node.module is None and node.level == 1:
            names.update(alias.asname or alias.name for alias in node.names)  # submodules
        targets = []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Assign):
            targets = node.targets
        for target in targets:
            if isinstance(target, ast.Name):
                names.add(target.id)
                if target.id == "__all__":
                    exported = ast.literal_eval(node.value)
    return names, classes, exported


def _public(name: str) -> bool:
    return not (name.startswith("__") and name.endswith("__"))


def _modules() -> list[tuple[str, types.ModuleType, Path]]:
    """(name, runtime module, its stub): the top of _core and each submodule."""
    found = [("_core", _core, STUBS / "__init__.pyi")]
    for name in sorted(dir(_core)):
        value = getattr(_core, name)
        if isinstance(value, types.ModuleType):
            found.append((f"_core.{name}", value, STUBS / f"{name}.pyi"))
    return found


@pytest.mark.parametrize("name, module, stub", _modules(), ids=lambda x: str(x))
def test_the_stub_has_every_name_of_the_module(name, module, stub):
    assert stub.exists(), f"write {stub.relative_to(STUBS.parent.parent.parent)} for {name}"
    names, _, exported = _stub(stub)
    runtime = {n for n in dir(module) if _public(n)}
    assert runtime - names == set(), f"add these to {stub.name}"
    assert {n for n in names if _public(n)} - runtime == set(), f"{name} has no such names"
    if name == "_core":
        assert "__version__" in names
    if hasattr(module, "__all__"):
        assert sorted(exported or []) == sorted(module.__all__), f"update __all__ in {stub.name}"


@pytest.mark.parametrize("name, module, stub", _modules(), ids=lambda x: str(x))
def test_the_stub_has_every_method_of_each_class(name, module, stub):
    _, classes, _ = _stub(stub)
    for attr in dir(module):
        cls = getattr(module, attr)
        if not inspect.isclass(cls):
            continue
        runtime = {m for m in vars(cls) if _public(m)}
        stubbed = {m for m in classes[attr] if _public(m)}
        assert runtime - stubbed == set(), f"add these methods of {attr} to {stub.name}"
        assert stubbed - runtime == set(), f"{attr} has no such methods"


def test_every_stub_file_stubs_a_module():
    stubbed = {path.stem for path in STUBS.glob("*.pyi")} - {"__init__"}
    assert stubbed <= set(dir(_core)), "a stub for a submodule _core does not have"
