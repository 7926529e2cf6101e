"""A trace's snapshot as a saved result's ``data``, and back.

The snapshot (torch's ``_snapshot()`` schema) shares its frames: torch and pickle keep one
dict per frame and one list per stack, referenced by every entry that has them. JSON would
write each reference out in full (a million-entry history, gigabytes), so the saved form
lists every distinct frame once (``frames``) and every distinct stack once (``stacks``, frame
indices), and each ``"frames"`` list in the snapshot becomes its stack's index. Loading
builds one dict per frame and one list per stack again, shared as before, which is also
what the analysis reads fastest (it interns frames by identity). Tuples become lists (as
in memory_viz's JSON); dict keys must be strings.

>>> snap = {"segments": [], "device_traces": [[
...     {"action": "alloc", "addr": 1, "size": 512, "frames": [{"filename": "a.py",
...      "line": 3, "name": "f"}]}]]}
>>> data = encode(snap)
>>> data["stacks"], data["snapshot"]["device_traces"][0][0]["frames"]
([[0]], 0)
>>> decode(data) == snap
True
"""

from __future__ import annotations

import json
from typing import Any

_PLAIN = (bool, int, float, str)


def encode(snapshot: dict[str, Any]) -> dict[str, Any]:
    """``{"frames": [...], "stacks": [[...]], "snapshot": {...}}``: JSON values only."""
    frames: list[dict[str, Any]] = []
    frame_index: dict[Any, int] = {}
    # By identity first (a snapshot repeats the same frame dicts and lists): each entry
    # keeps its object, so an id stays that object's for the whole encoding.
    frame_by_id: dict[int, tuple[Any, int]] = {}
    stacks: list[list[int]] = []
    stack_index: dict[tuple[int, ...], int] = {}
    stack_by_id: dict[int, tuple[Any, int]] = {}

    def frame(f: dict[str, Any], where: str) -> int:
        found = frame_by_id.get(id(f))
        if found is not None and found[0] is f:
            return found[1]
        plain = convert(f, where)
        try:
            key: Any = tuple(sorted(plain.items()))
            hash(key)
        except TypeError:  # a frame holding a list: compare its JSON text instead
            key = json.dumps(plain, sort_keys=True)
        index = frame_index.get(key)
        if index is None:
            index = frame_index[key] = len(frames)
            frames.append(plain)
        frame_by_id[id(f)] = (f, index)
        return index

    def stack(listed: list[Any] | tuple[Any, ...], where: str) -> int:
        found = stack_by_id.get(id(listed))
        if found is not None and found[0] is listed:
            return found[1]
        key = tuple(frame(f, f"{where}[{i}]") for i, f in enumerate(listed))
        index = stack_index.get(key)
        if index is None:
            index = stack_index[key] = len(stacks)
            stacks.append(list(key))
        stack_by_id[id(listed)] = (listed, index)
        return index

    def convert(value: Any, where: str) -> Any:
        if value is None or isinstance(value, _PLAIN):
            return value
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ValueError(
                        f"snapshot{where} has the key {key!r}: a saved trace holds str keys only"
                    )
                if (
                    key == "frames"
                    and isinstance(item, (list, tuple))
                    and all(isinstance(f, dict) for f in item)
                ):
                    out[key] = stack(item, where)
                else:
                    out[key] = convert(item, f"{where}[{key!r}]")
            return out
        if isinstance(value, (list, tuple)):
            return [convert(item, f"{where}[{i}]") for i, item in enumerate(value)]
        raise ValueError(
            f"snapshot{where} is a {type(value).__module__}.{type(value).__name__}: a saved "
            "trace holds plain values only (dict, list, tuple, str, int, float, bool, None)"
        )

    if not isinstance(snapshot, dict):
        raise ValueError(f"a trace's snapshot is a dict, not a {type(snapshot).__name__}")
    converted = convert(snapshot, "")
    return {"frames": frames, "stacks": stacks, "snapshot": converted}


def decode(data: dict[str, Any]) -> dict[str, Any]:
    """The snapshot ``encode`` saved, frames and stacks shared again; a ValueError naming
    what is damaged otherwise. (A loaded file's fields are checked by their derive first,
    ``_core.trace.validate``; this reads any data it is given as carefully.)"""
    listed = data.get("frames")
    if not isinstance(listed, list) or not all(isinstance(f, dict) for f in listed):
        raise ValueError('trace: "frames" must be a list of frame objects')
    frames = listed
    stacks: list[list[dict[str, Any]]] = []
    found = data.get("stacks")
    if not isinstance(found, list):
        raise ValueError('trace: "stacks" must be a list of lists of frame indices')
    for s, indices in enumerate(found):
        if not isinstance(indices, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(frames) for i in indices
        ):
            raise ValueError(f"trace: stack {s} must list frame indices (0 to {len(frames) - 1})")
        stacks.append([frames[i] for i in indices])

    def restore(value: Any) -> Any:
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if key == "frames" and isinstance(item, int) and not isinstance(item, bool):
                    if not 0 <= item < len(stacks):
                        raise ValueError(
                            f'trace: a "frames" entry names stack {item}, but there are '
                            f"{len(stacks)}"
                        )
                    out[key] = stacks[item]
                else:
                    out[key] = restore(item)
            return out
        if isinstance(value, list):
            return [restore(item) for item in value]
        return value

    if "snapshot" not in data:
        raise ValueError('trace: no "snapshot" field')
    snapshot = data["snapshot"]
    if not isinstance(snapshot, dict):
        raise ValueError('trace: "snapshot" must be an object (torch\'s snapshot dict)')
    return restore(snapshot)
