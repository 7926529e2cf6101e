"""A snapshot pickle read as plain data, never code: for what the streaming reader
(``_core.trace.TraceAnalysis.from_pickle``) leaves to Python (protocols 0 and 1, plain data
laid out unlike a snapshot) and for a loaded result's snapshot dict, built on demand.

Two locks, one behind the other: the file passes ``_core.trace.check_snapshot_pickle``
first (plain-data opcodes only, every table bounded by the file's size), then Python's
unpickler reads it with every way to code shut.
"""

from __future__ import annotations

import pickle
from typing import Any

from .. import _core


class _PlainDataUnpickler(pickle.Unpickler):
    """Python's unpickler with every way to code shut: no global is found (so nothing is
    imported, constructed or called), no persistent id is resolved. What it reads has
    passed ``_core.trace.check_snapshot_pickle`` first, which refuses those opcodes too and
    bounds every table by the file's size: two locks, one behind the other."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"refused to load {module}.{name}: memlab_rs never runs code from a file"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused a persistent id: not plain data")


def read_pickle(path: str) -> dict:
    """The snapshot dict in the pickle at ``path``, read as plain data only (never code)."""
    _core.trace.check_snapshot_pickle(path)  # ValueError naming the opcode or bound refused
    try:
        with open(path, "rb") as f:
            found = _PlainDataUnpickler(f).load()
    except FileNotFoundError:
        raise FileNotFoundError(f"no snapshot file at {path!r}") from None
    except MemoryError:
        raise
    except Exception as error:  # whatever plain data the checker passed and pickle refuses
        raise ValueError(
            f"{path!r} is not a snapshot pickle ({type(error).__name__}: {error}); write one "
            "with torch.cuda.memory._dump_snapshot(path)"
        ) from None
    if not isinstance(found, dict):
        raise ValueError(
            f"{path!r} is not a snapshot pickle: it holds a {type(found).__name__}, not the "
            "dict of torch.cuda.memory._snapshot()"
        )
    return found
