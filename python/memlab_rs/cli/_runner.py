"""Running a script or module as ``python script.py`` / ``python -m module`` would, for
``memlab-rs run``.

The same ``sys.argv`` (``argv[0]`` the script, or the module's file for ``-m``),
``sys.path[0]`` (the script's directory, or the working directory for ``-m``), a fresh
``__main__`` module in ``sys.modules`` with ``__file__``, ``__spec__`` and friends set as
Python sets them, and the same exit status: ``SystemExit``'s code, 1 after an uncaught
exception (its traceback printed by ``sys.excepthook``, without our frames), 130 after
KeyboardInterrupt. The code is compiled here rather than by ``runpy`` so that functions
named with ``--line`` are found in it before it runs (``line_profiler.targets``).
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import io
import os
import sys
import types
from dataclasses import dataclass
from typing import Any


class NotRunnable(Exception):
    """The script or module cannot be started: missing, a directory, not Python."""


@dataclass
class Main:
    """What runs as ``__main__``: its compiled code, the module it runs in, and the name the
    result files are named after."""

    code: types.CodeType
    module: types.ModuleType
    #: The script's file name without ``.py``, or the module's name.
    stem: str
    #: How to name it in messages: the script's path or ``-m module``.
    where: str


def script(path: str, args: list[str]) -> Main:
    """Compile ``path`` and set up ``sys.argv``/``sys.path`` as ``python path args`` does."""
    if not os.path.exists(path):
        raise NotRunnable(f"can't open file {path!r}: no such file")
    if os.path.isdir(path):
        raise NotRunnable(f"{path!r} is a directory: give a Python file, or -m MODULE")
    try:
        with io.open_code(path) as f:
            source = f.read()
    except OSError as e:
        raise NotRunnable(f"can't open file {path!r}: {e.strerror}") from None
    absolute = os.path.abspath(path)
    code = _compile(source, absolute)
    module = _fresh_main(
        __file__=absolute, __cached__=None, __loader__=None, __package__=None, __spec__=None
    )
    loader = importlib.machinery.SourceFileLoader("__main__", absolute)
    module.__loader__ = loader  # what inspect and linecache ask for the source
    sys.argv[:] = [path, *args]
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    stem = os.path.splitext(os.path.basename(path))[0]
    return Main(code, module, stem, path)


def module(name: str, args: list[str]) -> Main:
    """Find module ``name`` (a package runs its ``__main__``) and set up ``sys.argv`` and
    ``sys.path`` as ``python -m name args`` does."""
    sys.path[0] = os.getcwd()
    spec = _find_spec(name)
    if spec.submodule_search_locations is not None:  # a package: run its __main__
        spec = _find_spec(f"{name}.__main__")
    loader = spec.loader
    get_code = getattr(loader, "get_code", None)
    code = get_code(spec.name) if get_code is not None else None
    if code is None:
        raise NotRunnable(f"no code object available for {name!r}")
    origin = spec.origin if spec.has_location else None
    module = _fresh_main(
        __file__=origin,
        __cached__=spec.cached,
        __loader__=loader,
        __package__=spec.parent,
        __spec__=spec,
    )
    sys.argv[:] = [origin or name, *args]
    return Main(code, module, name, f"-m {name}")


def run(main: Main) -> int:
    """Run ``main``'s code as ``__main__`` and return its exit status."""
    sys.modules["__main__"] = main.module
    try:
        exec(main.code, main.module.__dict__)
    except SystemExit as e:
        return exit_status(e.code)
    except KeyboardInterrupt as e:
        _print_uncaught(e)
        return 130
    except BaseException as e:
        _print_uncaught(e)
        return 1
    return 0


def exit_status(code: Any) -> int:
    """The status ``SystemExit(code)`` ends the interpreter with: None is 0, an int is
    itself, anything else is printed on stderr and is 1 (as Python does).

    >>> exit_status(None), exit_status(3), exit_status(True)
    (0, 3, 1)
    """
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code)
    print(code, file=sys.stderr)
    return 1


def _print_uncaught(error: BaseException) -> None:
    """Print an uncaught exception as Python would: ``sys.excepthook`` (the user's, if the
    script set one), with the traceback starting in the script, not in this module."""
    tb = error.__traceback__
    tb = tb.tb_next if tb is not None else None
    error.__traceback__ = tb  # the hook prints the exception's own traceback
    sys.stdout.flush()
    sys.excepthook(type(error), error, tb)


def _compile(source: bytes, filename: str) -> types.CodeType:
    try:
        return compile(source, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        raise NotRunnable(f"{filename} is not valid Python: {e}") from None


def _find_spec(name: str) -> importlib.machinery.ModuleSpec:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as e:
        raise NotRunnable(f"no module named {name!r} ({e})") from None
    if spec is None:
        raise NotRunnable(f"no module named {name!r}")
    return spec


def _fresh_main(**attributes: Any) -> types.ModuleType:
    module = types.ModuleType("__main__")
    for key, value in attributes.items():
        setattr(module, key, value)
    module.__builtins__ = builtins  # type: ignore[attr-defined]
    return module
