"""Results as data: every tool's result saves to, and loads from, one JSON format.

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

import datetime
import gzip
import json
import os
import platform
import socket
import sys
from typing import Any, Callable, ClassVar, Protocol

from . import _args

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


def expect(data: Any, key: str, types: Any, where: str) -> Any:
    """``data[key]`` when it is of one of ``types`` (a type or a tuple; ``None`` in it
    allows null, ``float`` takes an int, ``int`` never takes a bool); else a ValueError
    naming ``where`` and the field. What a kind's ``from_data`` checks its fields with.

    >>> expect({"bytes": 5}, "bytes", int, "row 0")
    5
    >>> expect({"bytes": "5"}, "bytes", int, "row 0")
    Traceback (most recent call last):
    ...
    ValueError: row 0: "bytes" must be int, got '5'
    """
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
    if key not in data:
        raise ValueError(f'{where}: no "{key}" field')
    value = data[key]
    wanted = types if isinstance(types, tuple) else (types,)
    if value is None and None in wanted:
        return value
    for t in wanted:
        if t is None or (isinstance(value, bool) and t is not bool):
            continue  # a bool is not a number here
        if isinstance(value, t) or (t is float and isinstance(value, int)):
            return value
    names = " or ".join("null" if t is None else t.__name__ for t in wanted)
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    raise ValueError(f'{where}: "{key}" must be {names}, got {shown}')


def rank_info() -> dict[str, int]:
    """This process's rank, world size and local rank: torch.distributed's when a process
    group is initialised, else torchrun's environment (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``), else a single process (0, 1, 0).

    >>> rank_info()["world_size"] >= 1
    True
    """
    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1)
    local = _env_int("LOCAL_RANK", rank)
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
    except Exception:  # a broken or partial torch.distributed: the environment stands
        pass
    return {"rank": rank, "world_size": world, "local_rank": local}


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def run_meta(device: str | None = None, **extra: Any) -> dict[str, Any]:
    """Where and when a result was made: versions, host, process, rank, time, device.

    >>> sorted(run_meta("cpu"))[:4]
    ['argv', 'created', 'device', 'host']
    """
    import torch

    from . import __version__

    meta: dict[str, Any] = {
        "memlab_rs": __version__,
        "torch": torch.__version__.split("+")[0],
        "python": platform.python_version(),
        "platform": sys.platform,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "argv": list(sys.argv),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
    }
    meta.update(rank_info())
    meta.update(extra)
    return meta


def rank_heading(meta: dict[str, Any]) -> str | None:
    """The line that says which rank a result comes from, for a result made in a job of
    several processes (None for a single process): rank, world size, device and host.

    >>> rank_heading({"rank": 1, "world_size": 2, "device": "cuda:1", "host": "node7"})
    'rank 1 of 2 (cuda:1 on node7)'
    >>> rank_heading({"rank": 0, "world_size": 1}) is None
    True
    """
    world = meta.get("world_size")
    if not isinstance(world, int) or world <= 1:
        return None
    where = [str(meta[k]) for k in ("device", "host") if meta.get(k)]
    suffix = f" ({' on '.join(where)})" if where else ""
    return f"rank {meta.get('rank')} of {world}{suffix}"


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
    """``result`` as the JSON text of a result file."""
    return json.dumps(document(result), indent=indent, ensure_ascii=False, allow_nan=False)


def save(result: Result, path: str | os.PathLike[str]) -> None:
    """Write ``result`` to ``path`` (gzip when it ends in ``.gz``)."""
    name = _args.path(path, "path")
    text = dumps(result)
    if name.endswith(".gz"):
        with gzip.open(name, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        with open(name, "w", encoding="utf-8") as f:
            f.write(text)


def load(path: str | os.PathLike[str]) -> Any:
    """Read a result file written by ``save`` (any tool's): the result object its kind
    makes, rendering as it did where it was saved.

    Errors are ``ValueError``s that name the file and the problem: not JSON, not a
    memlab_rs result, a newer schema, an unknown kind.
    """
    name = _args.path(path, "path")
    return from_document(read_document(name), name)


def read_document(path: str | os.PathLike[str]) -> Any:
    """The parsed JSON of a file, gzip-compressed or not (told by its first bytes, so a
    renamed file reads too); a ValueError naming the file when it is not JSON.

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
        if compressed:
            with gzip.open(name, "rt", encoding="utf-8") as f:
                return json.load(f)
        with open(name, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{name}: no such result file") from None
    except (UnicodeDecodeError, json.JSONDecodeError, OSError, EOFError) as e:
        raise ValueError(
            f"{name}: not a memlab_rs result file (not JSON: {e}); results are written by "
            "save() or `memlab-rs run`"
        ) from None


def loads(text: str, name: str = "<string>") -> Any:
    """``load`` for a JSON string."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name}: not a memlab_rs result (not JSON: {e})") from None
    return from_document(doc, name)


def from_document(doc: Any, name: str = "<document>") -> Any:
    """The result object of a parsed result document."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(
            f'{name}: not a memlab_rs result file (no "format": "{FORMAT}"); results '
            "are written by save() or `memlab-rs run`"
        )
    schema = doc.get("schema")
    if not isinstance(schema, int) or schema < 1:
        raise ValueError(f"{name}: a memlab_rs result with a bad schema version {schema!r}")
    if schema > SCHEMA:
        from . import __version__

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
    if kind not in KINDS:
        known = ", ".join(sorted(KINDS))
        raise ValueError(f"{name}: unknown result kind {kind!r} (known: {known})")
    meta, data = doc.get("meta"), doc.get("data")
    if not isinstance(meta, dict) or not isinstance(data, dict):
        raise ValueError(f'{name}: a {kind} result without its "meta" or "data" object')
    try:
        return KINDS[kind](data, meta)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise ValueError(f"{name}: a damaged {kind} result ({type(e).__name__}: {e})") from None


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


class SavedResult:
    """What every result class shares: ``save(path)``, ``str()`` and ``repr()`` as its
    ``text()``, Jupyter's display as its ``html()`` (plain text where it has none).
    Subclasses define ``kind``, ``meta``, ``to_data()`` and ``text()``, and ``html()``
    where they have an HTML form; they override the rest where they differ."""

    kind: ClassVar[str]
    meta: dict[str, Any]

    def to_data(self) -> dict[str, Any]:
        raise NotImplementedError

    def text(self) -> str:
        raise NotImplementedError

    def html(self) -> str:
        raise NotImplementedError

    def save(self, path: str | os.PathLike[str]) -> None:
        """Save to a result file (``memlab_rs.load`` reads it; ``.gz`` compresses)."""
        save(self, path)

    def _repr_html_(self) -> str | None:
        try:
            return self.html()
        except NotImplementedError:  # no HTML form: Jupyter shows the text
            return None

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return self.text()


def write_csv(
    records: list[dict[str, Any]],
    path: str | os.PathLike[str] | None = None,
    fieldnames: list[str] | None = None,
) -> str:
    """Records (dicts with the same keys) as CSV text, also written to ``path`` when given:
    the one CSV writer of every result's ``to_csv``.

    >>> write_csv([{"line": 3, "bytes": 1024}])
    'line,bytes\\n3,1024\\n'
    """
    import csv
    import io

    out = io.StringIO()
    names = fieldnames if fieldnames is not None else list(records[0]) if records else []
    if names:
        writer = csv.DictWriter(out, fieldnames=names, lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
    return write_text(out.getvalue(), path)


def write_text(text: str, path: str | os.PathLike[str] | None, name: str = "path") -> str:
    """Write ``text`` to the caller's ``path`` (nothing for None) and return it: where every
    ``to_csv(path)``, ``to_json(path)`` and the like write. A path that is not a str or
    ``os.PathLike`` is a TypeError naming ``name``: ``open(True)`` would write to standard
    output and close it.

    >>> write_text("a,b\\n", None)
    'a,b\\n'
    """
    if path is not None:
        with open(_args.path(path, name), "w", encoding="utf-8", newline="") as f:
            f.write(text)
    return text


def _import_kinds() -> None:
    """Import the modules whose result classes register kinds."""
    import importlib

    for module in _KIND_MODULES:
        importlib.import_module(f"{__package__}.{module}")


#: The modules whose import registers a kind (by module name: ``memlab_rs.estimate`` the
#: attribute is the function, so ``from . import estimate`` would not name the module).
_KIND_MODULES = (
    "line_result",
    "reporter",
    "tracker",
    "estimate",
    "monitor_result",
    "trace",
    "pytest_result",
    "merge",
)
