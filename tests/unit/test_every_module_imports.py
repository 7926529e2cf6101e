"""Every module of the installed package imports on this CPython: the data-only unit tests
run on the newest CPython alone (noxfile.py, INTERPRETER_NEUTRAL_UNIT), so the syntax and
standard library of the modules only they exercise are checked here on every one."""

from __future__ import annotations

import importlib
import pkgutil

import memlab_rs


def test_every_module_of_the_package_imports():
    names = [info.name for info in pkgutil.walk_packages(memlab_rs.__path__, prefix="memlab_rs.")]
    assert len(names) > 60, names  # the walk saw the package, not an empty folder
    for name in names:
        module = importlib.import_module(name)
        assert module.__name__ == name
