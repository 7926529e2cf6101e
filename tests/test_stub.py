"""python/memlab_rs/_core.pyi covers every class, function and method of memlab_rs._core.

When the Rust core registers something new, add it to the stub: this test names what is
missing. `python -m mypy.stubtest memlab_rs._core` also checks the signatures.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from memlab_rs import _core

STUB = Path(__file__).parent.parent / "python" / "memlab_rs" / "_core.pyi"


def _stub():
    tree = ast.parse(STUB.read_text())
    names, classes, exported = set(), {}, None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            classes[node.name] = {
                item.name for item in node.body if isinstance(item, ast.FunctionDef)
            }
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


def test_the_stub_has_every_name_of_the_module():
    names, _, exported = _stub()
    runtime = {n for n in dir(_core) if _public(n)}
    assert runtime - names == set(), "add these to python/memlab_rs/_core.pyi"
    assert {n for n in names if _public(n)} - runtime == set(), "the module has no such names"
    assert "__version__" in names
    assert sorted(exported) == sorted(_core.__all__), "update __all__ in _core.pyi"


def test_the_stub_has_every_method_of_each_class():
    _, classes, _ = _stub()
    for name in dir(_core):
        cls = getattr(_core, name)
        if not inspect.isclass(cls):
            continue
        runtime = {m for m in vars(cls) if _public(m)}
        stubbed = {m for m in classes[name] if _public(m)}
        assert runtime - stubbed == set(), f"add these methods of {name} to _core.pyi"
        assert stubbed - runtime == set(), f"{name} has no such methods"
