"""A trace from what you already have: ``load`` takes a snapshot pickle, a ``trace``
result file, a snapshot written as JSON, or a snapshot dict, and tells them apart by their
first bytes. A pickle streams into the analysis without building its Python objects; what the
streaming reader leaves to Python is read as plain data (``plain_pickle``)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from .. import _core, results
from .options import analysis_options, default_exclude, exclude_parts, paths_choice
from .plain_pickle import read_pickle
from .result import TraceResult


def load(
    source: str | os.PathLike | dict,
    exclude: str | Sequence[str] | None = None,
    paths: str | None = None,
) -> TraceResult:
    """Analyse a snapshot you already have: a pickle from
    ``torch.cuda.memory._dump_snapshot`` (or ``TraceResult.save``), a ``trace`` result
    file (``TraceResult.save("x.json")``, gzip or not), a snapshot as JSON
    (``export_memory_viz(format="json")``), or the dict of ``torch.cuda.memory._snapshot()``.
    Runs anywhere, GPU or not. ``exclude`` (path parts whose frames are not a location; one
    str is one part) and ``paths`` (``"short"``, the default, or ``"full"``: see
    ``Tracer``) replace a result file's own.

    >>> import memlab_rs.trace as trace
    >>> trace.load({"segments": [], "device_traces": [[]]}).devices
    []
    """
    excluded = None if exclude is None else exclude_parts(exclude)
    shown = None if paths is None else paths_choice(paths)
    if isinstance(source, dict):
        return TraceResult(source, excluded, paths=shown or "short")
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"load() takes a path or a snapshot dict, got {type(source).__name__}")
    path = os.fspath(source)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    result = _load_file(path, excluded, shown)
    result._driver_applies = False  # the driver here now says nothing of that recording
    return result


def _load_file(path: str, excluded: list[str] | None, shown: str | None) -> TraceResult:
    """The result in the file at ``path``: JSON (a result file or a snapshot), else a
    snapshot pickle."""
    if _is_json(path):
        return _load_json(path, excluded, shown)
    if excluded is None:
        excluded = default_exclude()
    shown = shown or "short"
    try:
        # Streams the pickle into compact records: no dict of the whole snapshot in memory.
        analysis = _core.trace.TraceAnalysis.from_pickle(path, analysis_options(excluded, shown))
    except FileNotFoundError:
        raise FileNotFoundError(f"no snapshot file at {path!r}") from None
    except NotImplementedError:
        # A checked pickle the streaming reader does not read (protocols 0 and 1, plain data
        # laid out unlike a snapshot): the plain-data unpickler reads it.
        return TraceResult(read_pickle(path), excluded, paths=shown)
    return TraceResult._from_analysis(analysis, path, excluded, shown)


def _is_json(path: str) -> bool:
    """Whether the file at ``path`` is JSON or gzip (a pickle starts with its opcode)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except FileNotFoundError:
        raise FileNotFoundError(f"no snapshot file at {path!r}") from None
    return head[:2] == b"\x1f\x8b" or head.lstrip()[:1] == b"{"


def _load_json(path: str, exclude: list[str] | None, shown: str | None) -> TraceResult:
    """A ``trace`` result file, or a snapshot written as JSON."""
    try:
        doc = results.read_document(path)
    except ValueError:
        raise ValueError(
            f"{path}: neither a snapshot pickle nor a memlab_rs result (gzip or JSON that "
            "does not parse)"
        ) from None
    if isinstance(doc, dict) and "format" in doc:
        found = results.from_document(doc, path)
        if not isinstance(found, TraceResult):
            raise ValueError(
                f"{path}: a memlab_rs {found.kind} result, not a trace; read it with "
                "memlab_rs.load"
            )
        if exclude is None and shown in (None, found.paths):
            return found
        return TraceResult(
            found.snapshot,
            found.exclude if exclude is None else exclude,
            found.meta,
            shown or found.paths,
        )
    if isinstance(doc, dict) and "segments" in doc and "device_traces" in doc:
        result = TraceResult(doc, exclude, paths=shown or "short")
        result.meta["snapshot_file"] = os.path.abspath(path)
        return result
    raise ValueError(
        f"{path}: JSON, but neither a memlab_rs result nor a snapshot (no \"segments\" and "
        '"device_traces")'
    )
