"""A benchmark script of bench/ imported as a module, for tests that check its measurements
(bench/ is not a package; its scripts import their siblings, so bench/ goes on sys.path)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from paths import ROOT


def bench_module(name: str) -> ModuleType:
    """bench/<name>.py, loaded once and registered under `name` (its dataclasses look their
    module up in sys.modules)."""
    if name in sys.modules:
        return sys.modules[name]
    bench = str(ROOT / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
