"""Write a snapshot dict so that pytorch.org/memory_viz and torch's own tools read it.

Every memlab_rs recording, CPU or CUDA, is a snapshot dict in torch's schema (what
``torch.cuda.memory._snapshot()`` returns), with one extra key ``"memlab_rs"``. The viewer
reads a file as JSON first and falls back to its own small unpickler, which knows pickle
protocols 2 to 4 only (Python 3.14 pickles with protocol 5 by default): so we write protocol 4,
or JSON. torch's text tools (``python -m torch.cuda._memory_viz stats|trace FILE``) read the
pickle. Neither looks at keys it does not know, so ``"memlab_rs"`` stays in the file.

What is checked before writing, because the viewer fails on it without saying why:
- only plain values (dict with str keys, list, tuple, str, int, float, bool, None): the
  viewer's unpickler cannot build other objects (a NumPy integer, a tensor);
- each segment's blocks add up to its ``total_size`` and start at its address: the viewer
  places blocks one after another from the segment address, and torch's ``segsum``
  asserts the sum;
- for JSON, no NaN or infinity (not JSON).
"""

from __future__ import annotations

import json
import math
import os
import pickle
from pathlib import Path
from typing import Any, Union

from .. import _args
from ..results.atomic import atomic_open

PathLike = Union[str, "os.PathLike[str]"]

# The viewer's unpickler (torch/utils/viz/MemoryViz.js) stops at protocol 4.
PICKLE_PROTOCOL = 4
_SEGMENT_KEYS = ("device", "address", "total_size", "stream", "blocks")
_BLOCK_KEYS = ("size", "state")


def _plain(value: Any, where: str, seen: set[int], for_json: bool) -> None:
    """Raise unless ``value`` is made of plain values only (shared containers once)."""
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if for_json and not math.isfinite(value):
            raise ValueError(
                f"snapshot{where} is {value}, which JSON cannot hold; export with "
                'format="pickle" or replace it'
            )
        return
    if isinstance(value, (dict, list, tuple)):
        if id(value) in seen:  # frames are shared dicts: check each once
            return
        seen.add(id(value))
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise TypeError(
                        f"snapshot{where} has the key {key!r}; memory_viz reads str keys only"
                    )
                _plain(item, f"{where}[{key!r}]", seen, for_json)
        else:
            for i, item in enumerate(value):
                _plain(item, f"{where}[{i}]", seen, for_json)
        return
    raise TypeError(
        f"snapshot{where} is a {type(value).__module__}.{type(value).__name__}; memory_viz "
        "reads plain values only (dict, list, tuple, str, int, float, bool, None): convert "
        "it, e.g. int(x) for a NumPy integer"
    )


def _check_schema(snapshot: dict[str, Any]) -> None:
    for key in ("segments", "device_traces"):
        if not isinstance(snapshot.get(key), list):
            raise ValueError(
                f"the snapshot has no list {key!r}: pass the dict torch.cuda.memory._snapshot() "
                "returns, or a memlab_rs recording"
            )
    for s, segment in enumerate(snapshot["segments"]):
        if not isinstance(segment, dict):
            raise ValueError(f"snapshot['segments'][{s}] is not a dict")
        missing = [k for k in _SEGMENT_KEYS if k not in segment]
        if missing:
            raise ValueError(f"snapshot['segments'][{s}] has no {', '.join(map(repr, missing))}")
        for key in ("address", "total_size"):
            if not isinstance(segment[key], int):
                raise ValueError(f"snapshot['segments'][{s}][{key!r}] is not an int")
        offset = segment["address"]
        for b, block in enumerate(segment["blocks"]):
            if not isinstance(block, dict):
                raise ValueError(f"snapshot['segments'][{s}]['blocks'][{b}] is not a dict")
            lacking = [k for k in _BLOCK_KEYS if k not in block]
            if not lacking and not isinstance(block["size"], int):
                raise ValueError(f"snapshot['segments'][{s}]['blocks'][{b}]['size'] is not an int")
            if lacking:
                raise ValueError(
                    f"snapshot['segments'][{s}]['blocks'][{b}] has no "
                    f"{', '.join(map(repr, lacking))}"
                )
            if "address" in block and not isinstance(block["address"], int):
                raise ValueError(
                    f"snapshot['segments'][{s}]['blocks'][{b}]['address'] is not an int"
                )
            if "address" in block and block["address"] != offset:
                raise ValueError(
                    f"snapshot['segments'][{s}]['blocks'][{b}] starts at {block['address']:#x} "
                    f"but memory_viz places it at {offset:#x}, right after the blocks before "
                    "it: list every block of the segment, in address order"
                )
            offset += block["size"]
        if offset - segment["address"] != segment["total_size"]:
            raise ValueError(
                f"the blocks of snapshot['segments'][{s}] add up to "
                f"{offset - segment['address']} bytes, not its total_size "
                f"{segment['total_size']}: list every block, free ones ('inactive') included"
            )
    for d, trace in enumerate(snapshot["device_traces"]):
        if not isinstance(trace, list):
            raise ValueError(f"snapshot['device_traces'][{d}] is not a list of entries")
        for e, entry in enumerate(trace):
            if not isinstance(entry, dict) or "action" not in entry:
                raise ValueError(f"snapshot['device_traces'][{d}][{e}] has no 'action'")


def export_memory_viz(snapshot: dict[str, Any], path: PathLike, format: str = "pickle") -> Path:
    """Write ``snapshot`` to ``path`` for pytorch.org/memory_viz (drag the file onto the
    page) and torch's ``python -m torch.cuda._memory_viz stats|trace FILE``.

    ``format="pickle"`` writes pickle protocol 4 (what ``_dump_snapshot`` writes, minus
    protocol 5, which the viewer cannot read); ``format="json"`` writes JSON, which the
    viewer reads too (tuples become lists). The file is written whole or not at all.
    Returns the path written.

    >>> import pickle, tempfile, os
    >>> snap = {"segments": [{"device": 0, "address": 4096, "total_size": 512,
    ...     "allocated_size": 512, "stream": 0, "segment_type": "cpu", "blocks": [
    ...     {"address": 4096, "size": 512, "requested_size": 512,
    ...      "state": "active_allocated", "frames": []}]}], "device_traces": [[]]}
    >>> path = export_memory_viz(snap, os.path.join(tempfile.mkdtemp(), "trace.pickle"))
    >>> pickle.loads(path.read_bytes()) == snap
    True
    """
    if format not in ("pickle", "json"):
        raise ValueError(f'format must be "pickle" or "json", got {format!r}')
    if not isinstance(snapshot, dict):
        raise TypeError(
            f"expected a snapshot dict (torch.cuda.memory._snapshot() or a memlab_rs "
            f"recording), got {type(snapshot).__name__}"
        )
    _check_schema(snapshot)
    _plain(snapshot, "", set(), for_json=format == "json")
    target = Path(_args.path(path, "path"))
    # Whole or not at all: a failure leaves no half-written snapshot (results.atomic).
    with atomic_open(target, binary=format == "pickle") as f:
        if format == "pickle":
            pickle.dump(snapshot, f, protocol=PICKLE_PROTOCOL)
        else:
            json.dump(snapshot, f, allow_nan=False, separators=(",", ":"))
    return target
