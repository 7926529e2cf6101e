"""The result file: every tool's result saves to, and loads from, one JSON format.

A result file is one JSON object (gzip-compressed when the path ends in ``.gz``)::

    {
      "format": "memlab_rs.result",
      "schema": 1,
      "kind": "line_profile",         # which tool made it: see KINDS
      "meta": {...},                  # where and when: see run_meta()
      "data": {...}                   # the result itself, as the kind's class writes it
    }

Every renderer (text, HTML, CSV, JSON, plots) works from a result object, never from a
live collector, so a file loaded on a laptop renders exactly as on the cluster it came
from. The schema version is raised whenever the layout of ``meta`` or of a kind's ``data``
changes; a file from a newer memlab_rs is refused with a message saying so, one from an
older schema is migrated (``_MIGRATIONS``) or refused, saying why. docs/guide.md
(*Saved results*) documents every field.

>>> import os, tempfile, torch, memlab_rs
>>> def f():
...     return torch.zeros(256, 1024)
>>> with memlab_rs.LineProfiler(f, device="cpu") as profiler:
...     _ = f()
>>> path = os.path.join(tempfile.mkdtemp(), "profile.json.gz")
>>> profiler.result().save(path)
>>> loaded = memlab_rs.load(path)
>>> loaded.text() == profiler.display().__str__()
True
"""

from __future__ import annotations

import gzip
import json
import os
from typing import Any, Callable, Protocol

from .. import _args, _result_schema
from .atomic import atomic_open

FORMAT = "memlab_rs.result"
SCHEMA = 1


class Result(Protocol):
    """What every saved result provides: its kind, its meta, and its data as JSON values."""

    @property
    def kind(self) -> str:
        """Which tool made it (a key of ``KINDS``)."""

    @property
    def meta(self) -> dict[str, Any]:
        """Where and when it was made (``run_meta``)."""

    def to_data(self) -> dict[str, Any]:
        """The result as JSON-compatible values (the file's ``data``)."""


#: kind -> a function that rebuilds the result from (data, meta). Each result class
#: registers itself (``register``) when its module is imported.
KINDS: dict[str, Callable[[dict[str, Any], dict[str, Any]], Any]] = {}

# schema version -> a function turning a document of that version into the next one.
_MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def register(kind: str, from_data: Callable[[dict[str, Any], dict[str, Any]], Any]) -> None:
    """Make ``load`` rebuild results of ``kind`` with ``from_data(data, meta)``."""
    KINDS[kind] = from_data


def document(result: Result) -> dict[str, Any]:
    """The file's JSON object for ``result``."""
    return {
        "format": FORMAT,
        "schema": SCHEMA,
        "kind": result.kind,
        "meta": result.meta,
        "data": result.to_data(),
    }


def dumps(result: Result, indent: int | None = None) -> str:
    """``result`` as the JSON text of a result file. The data of a kind whose data Rust
    holds goes in as the text Rust wrote (``data_json()``), not parsed and written again."""
    if indent is None and hasattr(result, "data_json"):
        head = {"format": FORMAT, "schema": SCHEMA, "kind": result.kind, "meta": result.meta}
        text = json.dumps(head, ensure_ascii=False, allow_nan=False)
        return f'{text[:-1]}, "data": {result.data_json()}}}'
    return json.dumps(document(result), indent=indent, ensure_ascii=False, allow_nan=False)


def save(result: Result, path: str | os.PathLike[str]) -> None:
    """Write ``result`` to ``path`` (gzip when it ends in ``.gz``), whole or not at all: a
    failed save (a full disk, a killed process) leaves the file that was there."""
    text = dumps(result).encode("utf-8")
    name = _args.path(path, "path")
    with atomic_open(name, binary=True) as f:
        if name.endswith(".gz"):
            # The header names the file as gzip.open(name) would, not the temporary file.
            with gzip.GzipFile(os.path.basename(name), "wb", fileobj=f) as compressed:
                compressed.write(text)
        else:
            f.write(text)


def load(path: str | os.PathLike[str]) -> Any:
    """Read a result file written by ``save`` (any tool's): the result object its kind
    makes, rendering as it did where it was saved.

    Errors are ``ValueError``s that name the file and the problem: not JSON, not a
    memlab_rs result, a newer schema, an unknown kind, a damaged field (every field is
    checked before the result is built: ``_result_schema``).
    """
    name = _args.path(path, "path")
    return from_document(read_document(name), name)


#: A gzip-compressed result decompresses to at most this many times its size on disk (and
#: to at least ``GZIP_FLOOR`` bytes): the most compressible real results, a long training
#: monitor's record, reach about 80. A gzip bomb (deflate reaches 1,032) is refused
#: before it takes the memory.
GZIP_RATIO = 256
GZIP_FLOOR = 1 << 20


def read_document(path: str | os.PathLike[str]) -> Any:
    """The parsed JSON of a file, gzip-compressed or not (told by its first bytes, so a
    renamed file reads too); a ValueError naming the file when it is not a result's JSON
    (damaged gzip, a gzip bomb, not UTF-8, not JSON, nesting or numbers no result holds).

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "doc.json")
    >>> with open(path, "w") as f:
    ...     _ = f.write('{"a": 1}')
    >>> read_document(path)
    {'a': 1}
    """
    name = os.fspath(path)
    try:
        with open(name, "rb") as raw:
            compressed = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            data = _gunzip(raw, name) if compressed else raw.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{name}: no such result file") from None
    except IsADirectoryError:
        raise ValueError(f"{name}: a folder, not a result file") from None
    return parse_json(data, name)


def _gunzip(raw: Any, name: str) -> bytes:
    """The decompressed bytes of the gzip file ``raw``, at most ``GZIP_RATIO`` times its
    size; a ValueError naming the file when it is damaged or decompresses to more."""
    import zlib

    size = os.fstat(raw.fileno()).st_size
    limit = max(GZIP_FLOOR, GZIP_RATIO * size)
    chunks, total = [], 0
    try:
        with gzip.GzipFile(fileobj=raw, mode="rb") as f:
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                total += len(chunk)
                if total > limit:
                    raise ValueError(
                        f"{name}: decompresses to more than {limit:,} bytes, {GZIP_RATIO} "
                        f"times its size: a gzip bomb, not a memlab_rs result (real ones "
                        "compress less than 100 times)"
                    )
                chunks.append(chunk)
    except (OSError, EOFError, zlib.error) as e:
        raise ValueError(
            f"{name}: not a memlab_rs result file (damaged gzip: {e}); results are written "
            "by save() or `memlab-rs run`"
        ) from None
    return b"".join(chunks)


def parse_json(data: bytes | str, name: str) -> Any:
    """The JSON value of a result's text: UTF-8, checked by ``_core.check_result_json``
    first (nesting, numbers, NaN and Infinity), then parsed; a ValueError naming ``name``
    otherwise."""
    from .. import _core

    def refused(why: str) -> ValueError:
        return ValueError(
            f"{name}: not a memlab_rs result file ({why}); results are written by save() "
            "or `memlab-rs run`"
        )

    try:
        text = data if isinstance(data, str) else data.decode("utf-8")
        _core.check_result_json(data if isinstance(data, bytes) else data.encode("utf-8"))
        return json.loads(text)
    except UnicodeError as e:
        raise refused(f"not UTF-8: {e}") from None
    except json.JSONDecodeError as e:
        raise refused(f"not JSON: {e}") from None
    except (ValueError, RecursionError) as e:
        raise refused(str(e)) from None


def loads(text: str, name: str = "<string>") -> Any:
    """``load`` for a JSON string."""
    return from_document(parse_json(text, name), name)


def from_document(doc: Any, name: str = "<document>") -> Any:
    """The result object of a parsed result document."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(
            f'{name}: not a memlab_rs result file (no "format": "{FORMAT}"); results '
            "are written by save() or `memlab-rs run`"
        )
    schema = doc.get("schema")
    if type(schema) is not int or schema < 1:
        raise ValueError(f"{name}: a memlab_rs result with a bad schema version {schema!r}")
    if schema > SCHEMA:
        from .. import __version__

        raise ValueError(
            f"{name}: written with result schema {schema} by a newer memlab_rs; this is "
            f"memlab_rs {__version__} (schema {SCHEMA}): pip install -U memlab_rs"
        )
    while schema < SCHEMA:
        migrate = _MIGRATIONS.get(schema)
        if migrate is None:
            raise ValueError(
                f"{name}: result schema {schema} can no longer be read (this memlab_rs reads "
                f"schema {SCHEMA}); load it with the memlab_rs that wrote it"
            )
        doc = migrate(doc)
        schema = doc["schema"]
    kind = doc.get("kind")
    _import_kinds()
    if not isinstance(kind, str) or kind not in KINDS:
        known = ", ".join(sorted(KINDS))
        shown = repr(kind) if len(repr(kind)) <= 60 else repr(kind)[:57] + "..."
        raise ValueError(f"{name}: unknown result kind {shown} (known: {known})")
    meta, data = doc.get("meta"), doc.get("data")
    if not isinstance(meta, dict) or not isinstance(data, dict):
        raise ValueError(f'{name}: a {kind} result without its "meta" or "data" object')
    try:
        _result_schema.check(kind, data, meta)  # every field, before the class sees one
        return KINDS[kind](data, meta)
    except ValueError as e:
        raise ValueError(f"{name}: a damaged {kind} result: {e}") from None


def check_result(item: Any, name: str) -> Any:
    """``item`` if it is a result object (it has ``kind``, ``meta`` and ``to_data``); a
    TypeError naming ``name`` otherwise.

    >>> check_result(3, "a")
    Traceback (most recent call last):
    ...
    TypeError: a must be a memlab_rs result (...) or the path of a saved one, got 3 (int)
    """
    if not (isinstance(getattr(item, "kind", None), str) and hasattr(item, "to_data")):
        raise TypeError(
            f"{name} must be a memlab_rs result (profiler.result(), MemReporter().collect(), "
            f"...) or the path of a saved one, got {_args.shown(item)} ({type(item).__name__})"
        )
    return item


def _import_kinds() -> None:
    """Import the modules whose result classes register kinds."""
    import importlib

    for module in _KIND_MODULES:
        importlib.import_module(f"memlab_rs.{module}")


#: The modules whose import registers a kind, a merge or a diff (by module name, as
#: ``importlib`` finds them).
_KIND_MODULES = (
    "line_profiler",
    "tensor_report",
    "tracker",
    "estimation",
    "monitor",
    "trace",
    "test_memory",
    "doctor",
)
