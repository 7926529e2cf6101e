"""pytorch_memlab's module paths hold with ``import memlab_rs as pytorch_memlab``: code that
imports ``MemReporter`` from ``pytorch_memlab.mem_reporter`` and ``readable_size`` from
``pytorch_memlab.utils`` gets memlab_rs's very objects (docs/compat.md)."""

from __future__ import annotations

import importlib
import sys

import memlab_rs


def test_the_submodule_paths_give_memlab_rs_objects(monkeypatch):
    # The real pytorch_memlab may be imported in this process (the comparison tests do):
    # its modules are set aside, and the ones this test imports under its name removed.
    theirs = [n for n in sys.modules if n.split(".")[0] == "pytorch_memlab"]
    for name in theirs:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pytorch_memlab", memlab_rs)
    try:
        from pytorch_memlab.mem_reporter import MemReporter
        from pytorch_memlab.utils import readable_size

        assert MemReporter is memlab_rs.MemReporter
        assert readable_size is memlab_rs.readable_size
        assert readable_size(4194304) == "4.00M"
        assert importlib.import_module("memlab_rs.mem_reporter").MemReporter is MemReporter
        assert importlib.import_module("memlab_rs.utils").readable_size is readable_size
    finally:
        for name in ("pytorch_memlab.mem_reporter", "pytorch_memlab.utils"):
            sys.modules.pop(name, None)
