"""Functions named by qualified name (``memlab-rs run --line NAME``), profiled without
decorating them.

The line profiler watches code objects, and a function's code object exists before the
function does: it is a constant of the code that defines it. So a name is resolved from
the code that will define it, before that code runs:

- ``QUALNAME`` (``train_step``, ``Trainer.step``, ``main.<locals>.step``): a function the
  script (or the ``-m`` module) defines. Its compiled code is searched before it runs, so a
  name it does not define is an error before anything runs.
- ``MODULE:QUALNAME`` (``memlab_rs.models:Block.forward``): a function of another module.
  If that module is already imported, the function is looked up in it; otherwise a finder
  at the front of ``sys.meta_path`` waits for the import and searches the module's code
  when its loader compiles it, before the module body runs. The finder only answers for
  the modules named and removes itself once they are all imported.

No trace or profile function is installed and no function object is wrapped: the script
sees its own functions, and only the named code objects are watched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import sys
import types
from collections.abc import Iterator
from typing import Any

# A function's code has a fresh local namespace; a class body's does not.
_CO_NEWLOCALS = inspect.CO_NEWLOCALS


def defined_functions(
    code: types.CodeType, prefix: str = ""
) -> Iterator[tuple[str, types.CodeType]]:
    """(qualname, code) of every function and method that compiled ``code`` defines, at any
    depth (methods, nested functions as ``outer.<locals>.inner``); class bodies, lambdas
    and comprehensions are searched but not listed.

    >>> code = compile("class A:\\n    def f(self):\\n        def g(): pass\\n", "m", "exec")
    >>> [name for name, _ in defined_functions(code)]
    ['A.f', 'A.f.<locals>.g']
    """
    for const in code.co_consts:
        if not isinstance(const, types.CodeType):
            continue
        # co_qualname (3.11+) is the compiler's own; below it, rebuild it from the nesting.
        qualname = getattr(const, "co_qualname", None) or prefix + const.co_name
        function = bool(const.co_flags & _CO_NEWLOCALS)  # not a class body
        if function and not const.co_name.startswith("<"):
            yield qualname, const
        inner = f"{qualname}.<locals>." if function else f"{qualname}."
        yield from defined_functions(const, inner)


def split_names(names: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """(qualnames in the main script, {module: qualnames}) of ``--line`` names; a name
    without a qualname part is a ValueError saying how to write one.

    >>> split_names(["step", "memlab_rs.models:Block.forward", "__main__:f"])
    (['step', 'f'], {'memlab_rs.models': ['Block.forward']})
    """
    main: list[str] = []
    modules: dict[str, list[str]] = {}
    for name in names:
        module, colon, qualname = name.rpartition(":")
        if not qualname or (colon and not module):
            raise ValueError(
                f"--line {name!r}: give a function's qualified name (train_step, Model.forward) "
                "or MODULE:QUALNAME for a function of another module"
            )
        if not colon or module == "__main__":
            main.append(qualname)
        else:
            modules.setdefault(module, []).append(qualname)
    return main, modules


class LineTargets:
    """Registers the ``--line`` functions with ``profiler`` as their code is compiled."""

    def __init__(self, profiler: Any, names: list[str]):
        self._profiler = profiler
        self._main, self._modules = split_names(list(names))
        self._finder: _ImportWatcher | None = None
        #: MODULE:QUALNAME names whose module was imported without defining them.
        self.not_found: list[str] = []

    def add_main(self, code: types.CodeType, where: str) -> None:
        """Profile the main names in ``code`` (the script's, not yet run); a name it does
        not define is a ValueError listing the functions it does define."""
        defined = list(defined_functions(code))
        for name in self._main:
            found = [c for qualname, c in defined if qualname == name]
            if not found:
                have = ", ".join(dict.fromkeys(q for q, _ in defined)) or "no functions"
                raise ValueError(
                    f"--line {name}: {where} defines no function {name!r} (it defines: {have}); "
                    "for a function of another module write MODULE:QUALNAME"
                )
            for c in found:
                self._profiler._add_code(c, name)

    def install(self) -> None:
        """Profile the names of modules already imported; watch for the others."""
        for module in list(self._modules):
            if module in sys.modules:
                self._from_module(module, sys.modules[module])
        if self._modules:
            self._finder = _ImportWatcher(self)
            sys.meta_path.insert(0, self._finder)

    def uninstall(self) -> None:
        """Stop watching imports; the names still waiting are in ``waiting``."""
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._finder = None

    @property
    def waiting(self) -> list[str]:
        """MODULE:QUALNAME names whose module was never imported."""
        return [f"{m}:{q}" for m, names in self._modules.items() for q in names]

    def _wanted(self, module: str) -> bool:
        return module in self._modules

    def _from_code(self, module: str, code: types.CodeType) -> None:
        names = self._modules.pop(module, [])
        defined = list(defined_functions(code))
        for name in names:
            found = [c for qualname, c in defined if qualname == name]
            for c in found:
                self._profiler._add_code(c, name)
            if not found:
                self.not_found.append(f"{module}:{name}")
        if not self._modules:
            self.uninstall()

    def _from_module(self, module: str, obj: types.ModuleType) -> None:
        names = self._modules.pop(module, [])
        for name in names:
            code = _code_in_module(obj, name)
            if code is None:
                self.not_found.append(f"{module}:{name}")
            else:
                self._profiler._add_code(code, name)


def _code_in_module(module: types.ModuleType, qualname: str) -> types.CodeType | None:
    """The code object of ``qualname`` in an imported module: attributes up to the first
    ``<locals>``, then the nested code of that function."""
    from memlab_rs.line_profiler.code import code_of

    outer, _, _ = qualname.partition(".<locals>.")
    obj: Any = module
    for part in outer.split("."):
        obj = inspect.getattr_static(obj, part, None)
        if obj is None:
            return None
    found = code_of(obj)
    if found is None:
        return None
    if outer == qualname:
        return found[0]
    for name, code in defined_functions(found[0], f"{outer}.<locals>."):
        if name == qualname:
            return code
    return None


class _ImportWatcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched module, it asks the finders after it and has the
    loader hand over the module's code once compiled, before the module body runs."""

    def __init__(self, targets: LineTargets):
        self._targets = targets

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not self._targets._wanted(fullname):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                self._watch(fullname, spec)
                return spec
        return None

    def _watch(self, fullname: str, spec: importlib.machinery.ModuleSpec) -> None:
        loader = spec.loader
        get_code = getattr(loader, "get_code", None)
        if loader is None or get_code is None:
            return
        targets = self._targets

        # The loader was made for this spec alone (FileFinder makes one per find), so an
        # attribute on it changes nothing for any other module.
        def get_code_watched(name: str) -> Any:
            code = get_code(name)
            if code is not None and name == fullname:
                targets._from_code(fullname, code)
            return code

        loader.get_code = get_code_watched  # type: ignore[attr-defined]
