"""What was alive at the peak, and who allocated it: allocation history, by line and by module.

On CUDA it reads torch's own allocation history (every alloc and free with its Python stack,
about 2 us per allocation; no custom allocator), and turns your previous history setting back
on stop. On CPU it records through memlab_rs's CPU allocator hook, capturing stacks only while
tracing. Either way the recording is a snapshot in torch's schema, so files from
``torch.cuda.memory._dump_snapshot`` load and analyse the same way, and ours open in
pytorch.org/memory_viz.

>>> import torch, memlab_rs.trace as trace
>>> with trace.Tracer(device="cpu") as tr:
...     x = torch.empty(1024, 256)        # 1 MiB, alive at the peak
>>> tr.result.max_mem("cpu") >= 1 << 20
True
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import _args, _core, results
from ._sources import cpu_source  # noqa: F401  (the CPU source's glue)
from ._torch import device_key
from ._trace_names import start_names
from .results.atomic import atomic_open

DEFAULT_MAX_ENTRIES = 1_000_000
_USER_LIKE = ("demo.py", "models.py")

__all__ = [
    "PeakRow",
    "TraceResult",
    "Tracer",
    "default_exclude",
    "load",
    "report_stats",
    "start_tracing",
    "stop_tracing",
    "switch_allocator",
]


def default_exclude() -> list[str]:
    """Path parts whose frames are not "the location" of an allocation: torch, the standard
    library and memlab_rs, here and (by their usual install paths) on other machines.

    >>> any("torch" in p for p in default_exclude())
    True
    """
    here = os.path.dirname(os.path.abspath(__file__))
    parts = [
        os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
        "-packages/torch/",
    ]
    # memlab_rs's own machinery; its demo and bundled model are user code like any other.
    for name in sorted(os.listdir(here)):
        if name.endswith(".py") and name not in _USER_LIKE:
            parts.append(f"{os.sep}memlab_rs{os.sep}{name}")
    # The standard library, here or on the machine that recorded: /.../lib/python3.N/
    # outside site-packages (a virtual environment's lib/python3.N/ holds site-packages too,
    # so its path alone cannot say).
    parts.append("<stdlib>")
    return list(dict.fromkeys(parts))


def _exclude_parts(exclude: Any) -> list[str]:
    """``exclude`` as a list of path parts: None is ``default_exclude()``; one string (or
    ``os.PathLike``) is one part, never its characters; any other iterable lists parts."""
    if exclude is None:
        return default_exclude()
    if isinstance(exclude, (str, os.PathLike)):
        items: list[Any] = [exclude]
    elif isinstance(exclude, (bytes, bytearray, dict)):
        raise TypeError(
            f"exclude={exclude!r}: give path parts as a list of str (['torch/', '<stdlib>']), "
            "one str, or None for default_exclude()"
        )
    else:
        try:
            items = list(exclude)
        except TypeError:
            raise TypeError(
                f"exclude={exclude!r}: give path parts as a list of str (['torch/', "
                "'<stdlib>']), one str, or None for default_exclude()"
            ) from None
    parts = []
    for i, item in enumerate(items):
        part = os.fspath(item) if isinstance(item, os.PathLike) else item
        if not isinstance(part, str):
            raise TypeError(
                f"exclude[{i}]={item!r}: each path part must be a str (a file whose path "
                "contains it is not a location)"
            )
        if not part:
            raise ValueError(
                f"exclude[{i}] is an empty string: it is part of every path, so no frame "
                "could be a location; leave it out (exclude=[] shows every frame)"
            )
        parts.append(part)
    return parts


def _paths(paths: Any, name: str = "paths") -> str:
    """``paths`` checked: ``"short"`` or ``"full"``."""
    if not isinstance(paths, str) or paths not in ("short", "full"):
        raise ValueError(
            f"{name}={paths!r}: use 'short' (packages from their directory, files here "
            "relative to the working directory) or 'full' (paths as recorded)"
        )
    return paths


def _cwd() -> str | None:
    """The working directory, which short paths are relative to (None if it is gone)."""
    try:
        return os.getcwd()
    except OSError:
        return None


def _keyword_groups(groups: Any) -> list[tuple[str, list[str]]]:
    """``groups`` as (name, keywords) pairs: one string is one keyword, never its
    characters."""
    if not isinstance(groups, Mapping):
        raise TypeError(
            "groups must be a dict of a group's name to its keywords, e.g. "
            f'{{"weights": ["weight"], "attention": ["attn"]}}, got {_args.shown(groups)} '
            f"({type(groups).__name__})"
        )
    out = []
    for name, words in groups.items():
        if not isinstance(name, str):
            raise TypeError(f"groups: the group name {name!r} must be a str")
        listed = [words] if isinstance(words, str) else words
        try:
            listed = list(listed)
        except TypeError:
            raise TypeError(
                f"groups[{name!r}]={words!r}: give the group's keywords as a list of str "
                "(or one str)"
            ) from None
        for word in listed:
            if not isinstance(word, str):
                raise TypeError(
                    f"groups[{name!r}]: the keyword {word!r} must be a str (a row goes to the "
                    "first group with a keyword in its name)"
                )
            if not word:
                raise ValueError(
                    f"groups[{name!r}] has an empty keyword: it is part of every name, so the "
                    "group would take every row; leave it out"
                )
        out.append((name, listed))
    return out


@dataclass(frozen=True)
class PeakRow:
    """One row of the peak table: the allocations of one location (or module) alive at the
    peak, their total, running total, median size and count."""

    location: str
    bytes: int
    cumulative: int
    median: int
    count: int


class TraceResult:
    """A recording and its analysis. Renders as the peak tracer's table (``str``), HTML in
    Jupyter, CSV, JSON, a data frame, a timeline; saves as a ``trace`` result file
    (``save("x.json")`` or ``.json.gz``, read by ``memlab_rs.load`` and ``trace.load``) or
    as a snapshot pickle torch's tools read (any other name).

    >>> import os, tempfile, torch, memlab_rs, memlab_rs.trace as trace
    >>> with trace.Tracer(device="cpu") as tr:
    ...     x = torch.empty(256, 1024)
    >>> tr.result.rows("cpu")[0].bytes >= 1 << 20
    True
    >>> path = os.path.join(tempfile.mkdtemp(), "trace.json.gz")
    >>> tr.result.save(path)
    >>> memlab_rs.load(path).text() == tr.result.text()
    True
    """

    kind = "trace"

    def __init__(
        self,
        snapshot: dict,
        exclude: str | Sequence[str] | None = None,
        meta: dict[str, Any] | None = None,
        paths: str = "short",
    ):
        if meta is not None and not isinstance(meta, dict):
            raise TypeError(
                f"meta must be a dict (results.run_meta()) or None, got {_args.shown(meta)}"
            )
        self._snapshot: dict | None = snapshot
        self._path: str | None = None
        self.exclude = _exclude_parts(exclude)
        #: How files are shown: ``"short"`` or ``"full"`` (see ``Tracer``).
        self.paths = _paths(paths)
        self._analysis = _core.TraceAnalysis(snapshot, self.exclude, paths == "full", _cwd())
        # Whether the CUDA driver's reading now can stand for the recording's device
        # (keywords' expected_sum="driver"): not for a result read from a file.
        self._driver_applies = True
        #: Where and when the result was made (``results.run_meta``); ``device`` is the
        #: device recorded when there is one.
        self.meta = self._made_here() if meta is None else meta

    @classmethod
    def _from_analysis(
        cls, analysis: Any, path: str, exclude: list[str], paths: str
    ) -> TraceResult:
        """A result read straight from the pickle at `path` (its dict is loaded on demand)."""
        result = cls.__new__(cls)
        result._snapshot = None
        result._path = path
        result.exclude = exclude
        result.paths = paths
        result._analysis = analysis
        result._driver_applies = False
        result.meta = result._made_here(snapshot_file=os.path.abspath(path))
        return result

    def _made_here(self, **extra: Any) -> dict[str, Any]:
        devices = self.devices
        return results.run_meta(devices[0] if len(devices) == 1 else None, **extra)

    @property
    def snapshot(self) -> dict:
        """The snapshot dict (torch's schema). A result loaded from a file reads it from
        there only when asked, since the dict of a large snapshot takes several times the
        file's size in memory."""
        if self._snapshot is None:
            assert self._path is not None
            self._snapshot = _read_pickle(self._path)
        return self._snapshot

    # -- which device ------------------------------------------------------------------
    @property
    def source(self) -> str:
        """ "cuda" or "cpu"."""
        return self._analysis.source

    @property
    def devices(self) -> list[str]:
        """The devices with recorded allocations, e.g. ``["cuda:0"]`` or ``["cpu"]``."""
        return [self._analysis.device_name(d) for d in self._analysis.devices]

    def _index(self, device: Any) -> int:
        if device is None:
            indices = self._analysis.devices
            if not indices:
                raise ValueError("the trace recorded no allocations on any device")
            return indices[0]
        if self.source == "cpu":
            if device_key(device) != "cpu":
                raise ValueError(f"device={device!r}: this trace recorded CPU memory; use 'cpu'")
            return self._analysis.devices[0] if self._analysis.devices else 0
        key = device_key(device)
        if not key.startswith("cuda:"):
            raise ValueError(f"device={device!r}: this trace recorded CUDA memory; use 'cuda:N'")
        return int(key[5:])

    # -- numbers -------------------------------------------------------------------------
    def summary(self, device: Any = None) -> dict[str, int]:
        """The peak figures: ``max_mem`` (the highest allocated bytes, what
        ``max_memory_allocated`` reports over the region), ``total_allocated``,
        ``start_allocated``, ``end_allocated``, ``peak_time_us``, ``events``."""
        return self._analysis.summary(self._index(device))

    def max_mem(self, device: Any = None) -> int:
        """The highest allocated bytes over the recording (`Max mem`)."""
        return self.summary(device)["max_mem"]

    def rows(self, device: Any = None) -> list[PeakRow]:
        """The allocations alive at the peak by location, biggest first; ``untraced`` is what
        was allocated before recording began. The rows add up to ``max_mem`` exactly."""
        return [PeakRow(*row) for row in self._analysis.rows(self._index(device))]

    def module_rows(self, device: Any = None) -> list[PeakRow]:
        """The same live set by ``phase:module`` tag (forward, backward, optimizer): the
        recorded tag, else what the frames say, else ``(untagged)``; a phase with no module
        reads ``phase:(no module)``. Every module view (``module_text``, ``to_csv``,
        ``to_json``, HTML, ``keywords``, ``untagged_log``) reads this one grouping."""
        return [PeakRow(*row) for row in self._analysis.module_rows(self._index(device))]

    def notices(self, device: Any = None) -> list[str]:
        """Why the result may be incomplete (also printed under the table)."""
        return self._analysis.notices(self._index(device))

    def line_peak_live(self, device: Any = None) -> dict[tuple[str, int], int]:
        """Bytes alive at the peak per ``(filename, line)``, callees included: what each
        line allocated that was still alive at the peak."""
        return self._analysis.line_peak_live(self._index(device))

    def keywords(
        self,
        groups: Mapping[str, str | Sequence[str]],
        expected_sum: int | None | str = "driver",
        device: Any = None,
        by: str = "module",
    ) -> list[tuple[str, int]]:
        """The tagging profiler's keyword groups: each row of the live set at the peak goes
        to the first group with a keyword in its tag (``by="module"``) or location
        (``by="location"``); ``Others`` takes the rest; ``Untrackable`` is ``expected_sum``
        minus what was tracked (the bytes alive at the peak). ``expected_sum="driver"`` (the
        default) asks the CUDA driver what is used on the device now: that includes the CUDA
        context, the allocator's cache, other libraries' memory and other processes. Where
        the driver cannot tell (a CPU trace, a trace read from a file, no driver, less in
        use now than at the peak) Untrackable is left out with a warning saying why; None
        leaves it out quietly. Bytes below what was tracked are a ValueError.

        >>> import torch, memlab_rs.trace as trace
        >>> with trace.Tracer(device="cpu") as tr:
        ...     w = torch.empty(256, 1024)
        >>> groups = tr.result.keywords({"big": ["untraced"]}, expected_sum=None)
        >>> [name for name, _ in groups]
        ['big', 'Others']
        """
        return self._keywords(groups, expected_sum, device, by)

    def _keywords(
        self, groups: Any, expected_sum: Any, device: Any, by: str, stacklevel: int = 3
    ) -> list[tuple[str, int]]:
        if by not in ("module", "location"):
            raise ValueError(f"by={by!r}: use 'module' or 'location'")
        items = _keyword_groups(groups)
        index = self._index(device)
        items = _keyword_groups(groups)
        found = self._analysis.keywords(index, items, None, by == "module")
        tracked = self.max_mem(device)  # the rows add up to it
        expected = self._expected_sum(expected_sum, index, tracked, stacklevel + 1)
        if expected is not None:
            found.append(("Untrackable", expected - tracked))
        return found

    def _expected_sum(self, expected_sum: Any, index: int, tracked: int, stacklevel: int):
        """The bytes Untrackable is counted from, or None to leave it out (warning why,
        where the default could not be honoured)."""
        if isinstance(expected_sum, str) and expected_sum == "driver":
            why = None
            if self.source != "cuda":
                why = "this trace recorded CPU memory, which the CUDA driver does not count"
            elif not self._driver_applies:
                why = (
                    "this trace was read from a file, and the driver can only say what this "
                    "machine uses now"
                )
            else:
                used = _driver_used(index)
                if used is None:
                    why = "the CUDA driver could not be read here"
                elif used < tracked:
                    why = (
                        f"the driver says {used} bytes are used on cuda:{index} now, less than "
                        f"the {tracked} bytes alive at the peak (memory was given back since, "
                        "e.g. by torch.cuda.empty_cache())"
                    )
                else:
                    return used
            warnings.warn(
                f"keywords(expected_sum='driver'): {why}; Untrackable is left out. Pass the "
                "bytes you expect at the peak, or expected_sum=None to leave it out without "
                "this warning",
                stacklevel=stacklevel,
            )
            return None
        if expected_sum is None:
            return None
        # bytes, as every size memlab_rs takes: an int, "2 GiB"
        expected = _args.size(expected_sum, "expected_sum (bytes, None or 'driver')")
        if expected < tracked:
            raise ValueError(
                f"expected_sum={expected} is less than the {tracked} bytes alive at the peak "
                "(what the groups add up to), so Untrackable would be negative; pass the total "
                "you expect at the peak in bytes (torch.cuda.max_memory_reserved(), say), or "
                "None to leave Untrackable out"
            )
        return expected

    # -- renderings ------------------------------------------------------------------
    def text(self) -> str:
        """The peak tracer's report: ``Max mem``, ``Total mem allocated``, then
        ``Mem, Cumulative Mem, Median, Count, Location`` rows."""
        return self._analysis.text()

    def module_text(self) -> str:
        """The same table by module and phase."""
        return self._analysis.module_text()

    def report_stats(self) -> None:
        """Print the peak tracer's report."""
        print(self.text(), end="")

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """The report as JSON (figures, rows by location and module, notices)."""
        return results.write_text(self._analysis.json(), path)

    def to_dict(self) -> dict:
        return json.loads(self._analysis.json())

    def to_csv(self, path: str | os.PathLike | None = None, device: Any = None) -> str:
        """The tagging profiler's CSV: ``tag,MiB``, one row per tag alive at the peak."""
        return results.write_text(self._analysis.tag_csv(self._index(device)), path)

    def untagged_log(self, path: str | os.PathLike | None = None, device: Any = None) -> str:
        """The stacks of the allocations of the module view's ``(untagged)`` row (neither a
        tag nor their frames place them in a phase), biggest first; they add up to it."""
        return results.write_text(self._analysis.untagged_log(self._index(device)), path)

    def to_dataframe(self, device: Any = None, by: str = "location"):
        """The rows as a pandas DataFrame (pandas is an optional extra)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                "to_dataframe() needs pandas: pip install pandas (or memlab_rs[pandas])"
            ) from None
        _args.choice(by, "by", ("location", "module"))
        rows = self.rows(device) if by == "location" else self.module_rows(device)
        key = "location" if by == "location" else "module"
        return pd.DataFrame(
            [(r.location, r.bytes, r.cumulative, r.median, r.count) for r in rows],
            columns=[key, "bytes", "cumulative", "median", "count"],
        )

    def timeline(self, device: Any = None, top: int = 8, max_points: int = 2000) -> dict:
        """Allocated bytes over the recording, downsampled to ``max_points`` (each the
        highest moment of its stretch, so the peak keeps its exact height), with the ``top``
        locations of the peak stacked: a dict with ``title, time_us, total, layers,
        peak_index, peak_bytes, notices``."""
        top = _args.count(top, "top", what="a number of locations, an int")
        max_points = _args.count(max_points, "max_points", minimum=1, what="an int")
        return self._analysis.timeline(self._index(device), top, max_points)

    def timeline_html(self, path: str | os.PathLike | None = None, device: Any = None) -> str:
        """The timeline as one self-contained HTML file (no network needed to open it)."""
        return results.write_text(_core._trace_timeline_html(self.timeline(device)), path)

    def timeline_png(self, path: str | os.PathLike, device: Any = None) -> None:
        """The timeline as a PNG (needs matplotlib)."""
        from ._trace_plots import timeline_png

        timeline_png(self.timeline(device), path)

    def keyword_plot(
        self,
        path: str | os.PathLike,
        groups: Mapping[str, str | Sequence[str]],
        expected_sum: int | None | str = "driver",
        device: Any = None,
    ) -> None:
        """The tagging profiler's two-bar plot of the keyword groups (needs matplotlib)."""
        from ._trace_plots import keyword_plot_png

        mib = 1 << 20
        found = self._keywords(groups, expected_sum, device, "module")
        expected = sum(b for _, b in found)
        keyword_plot_png([(g, b / mib) for g, b in found], expected / mib, path)

    def save(self, path: str | os.PathLike) -> None:
        """Save the result: a path ending in ``.json`` or ``.json.gz`` gets a ``trace``
        result file (the snapshot, the exclude list and ``meta``; ``memlab_rs.load`` and
        ``trace.load`` read it), any other a snapshot pickle (protocol 4) that ``load``,
        torch's tools and pytorch.org/memory_viz read. Written whole or not at all: a
        failed save leaves the file that was there."""
        name = path = _args.path(path, "path")
        if name.endswith((".json", ".json.gz")):
            results.save(self, name)
            return
        if self._snapshot is None and self._path is not None:
            with open(self._path, "rb") as src:
                protocol4 = src.read(2) == b"\x80\x04"
                if protocol4:  # already what memory_viz reads: a copy, without loading it
                    if os.path.abspath(self._path) != os.path.abspath(path):
                        src.seek(0)
                        with atomic_open(path, binary=True) as f:
                            shutil.copyfileobj(src, f, 1 << 20)
                    return
        with atomic_open(path, binary=True) as f:
            pickle.dump(self.snapshot, f, protocol=4)

    def to_data(self) -> dict[str, Any]:
        """The result as JSON values (a saved file's ``data``): ``source``, ``exclude``,
        ``paths``, and the snapshot with its frames and stacks listed once (``frames``,
        ``stacks``)."""
        from ._trace_saved import encode

        return {
            "source": self.source,
            "exclude": list(self.exclude),
            "paths": self.paths,
            **encode(self.snapshot),
        }

    @classmethod
    def from_data(cls, data: dict[str, Any], meta: dict[str, Any]) -> TraceResult:
        """The result from a saved file's ``data`` and ``meta`` (checked by ``load``
        against ``_result_schema.TRACE``; the snapshot by the trace reader)."""
        from ._trace_saved import decode

        source = data["source"]
        paths = _paths(data.get("paths", "short"), 'trace: "paths"')  # older files: short
        result = cls(decode(data), list(data["exclude"]), meta, paths)
        result._driver_applies = False
        if result.source != source:
            raise ValueError(
                f'trace: "source" says {source!r} but the snapshot is a {result.source} one'
            )
        return result

    def export_memory_viz(self, path: str | os.PathLike, format: str = "pickle") -> None:
        """Write the recording in the form pytorch.org/memory_viz opens (pickle protocol 4
        or JSON)."""
        from ._memory_viz_export import export_memory_viz

        export_memory_viz(self.snapshot, path, format=format)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        parts = [f"{d}: max {self.max_mem(d)} bytes" for d in self.devices]
        return f"<TraceResult {self.source} {', '.join(parts) or 'empty'}>"

    def _repr_html_(self) -> str:
        return self._analysis.html()


results.register("trace", TraceResult.from_data)


def _driver_used(index: int) -> int | None:
    """Bytes in use on a CUDA device by the driver's count (cudarc; None without a driver)."""
    found = _core.driver_device_memory(index) if _core.driver_available() else None
    return None if found is None else found[0]


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
    excluded = None if exclude is None else _exclude_parts(exclude)
    shown = None if paths is None else _paths(paths)
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
        analysis = _core.TraceAnalysis.from_pickle(path, excluded, shown == "full", _cwd())
    except FileNotFoundError:
        raise FileNotFoundError(f"no snapshot file at {path!r}") from None
    except NotImplementedError:
        # A checked pickle the streaming reader does not read (protocols 0 and 1, plain data
        # laid out unlike a snapshot): the plain-data unpickler reads it.
        return TraceResult(_read_pickle(path), excluded, paths=shown)
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


class _PlainDataUnpickler(pickle.Unpickler):
    """Python's unpickler with every way to code shut: no global is found (so nothing is
    imported, constructed or called), no persistent id is resolved. What it reads has
    passed ``_core.check_snapshot_pickle`` first, which refuses those opcodes too and
    bounds every table by the file's size: two locks, one behind the other."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"refused to load {module}.{name}: memlab_rs never runs code from a file"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused a persistent id: not plain data")


def _read_pickle(path: str) -> dict:
    """The snapshot dict in the pickle at ``path``, read as plain data only (never code)."""
    _core.check_snapshot_pickle(path)  # ValueError naming the opcode or bound refused
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


class Tracer:
    """Record allocations and frees with their stacks over a region, then analyse them.

    ``device``: ``"cpu"``, ``"cuda"``/``"cuda:N"``/``N``, or None (CUDA when torch sees a
    GPU, else CPU). ``max_entries`` bounds the history (a ring buffer: the oldest entries
    go, and the report says so). ``model``: names modules by their path in it when tagging,
    and names what was alive at the start by tensor in the module view
    (``untraced:0.weight``, ``untraced:0.weight.grad``, ``untraced:Adam.0.weight.exp_avg``;
    optimizers are found alive); without it, the root modules found alive name them.
    ``tag_modules``: record the module and phase running each allocation (module hooks;
    ``True``: forward, backward and optimizer step; ``"forward"``: forward and optimizer
    only, cheaper; ``False``, the default: no hooks, and the module view reads the phase
    and the innermost ``forward`` from each allocation's frames instead). Module hooks cost
    nothing on a GPU-bound step but slow a CPU-bound one (GPT-2 at batch 1x64: 1.19x on top
    of the history's 1.11x); see the guide. ``exclude``: the path parts whose frames are not
    a location (None: ``default_exclude()``; one str is one part, ``[]`` shows every frame).
    ``paths``: how files are shown in the rows and stacks: ``"short"`` (the default, as the
    peak tracer shows them: an installed package's file from its package down,
    ``.../transformers/models/llama/modeling_llama.py``; a file under the working directory
    of ``start()`` relative to it, ``models/gpt.py``; any other in full) or ``"full"``.

    On CUDA the allocator's history is turned on with Python stacks for alloc events (unless
    you already had it on: then your setting is kept) and turned back off on stop; the
    allocator statistics are not reset.

    >>> import torch, memlab_rs.trace as trace
    >>> with trace.Tracer(device="cpu") as tr:
    ...     a = torch.ones(1024, 1024)
    ...     b = a * 2
    >>> tr.result.max_mem("cpu") >= 8 << 20
    True
    """

    def __init__(
        self,
        device: Any = None,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        model: torch.nn.Module | None = None,
        tag_modules: bool | str = False,
        exclude: str | Sequence[str] | None = None,
        paths: str = "short",
    ):
        max_entries = _args.count(max_entries, "max_entries", minimum=1)
        exclude = None if exclude is None else _exclude_parts(exclude)
        if tag_modules not in (True, False, "forward"):
            raise ValueError(f"tag_modules={tag_modules!r}: use True, False or 'forward'")
        if model is not None and not isinstance(model, torch.nn.Module):
            got = (
                f"the class {model.__name__}"
                if isinstance(model, type)
                else f"a {type(model).__name__}"
            )
            raise TypeError(
                f"Tracer(model=...): model must be a torch.nn.Module instance or None (its "
                f"module paths name the tags), got {got} ({_args.shown(model)}); pass the model "
                "object itself, e.g. Tracer(model=net, tag_modules=True)"
            )
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        key = device_key(device)
        if key != "cpu" and not key.startswith("cuda:"):
            raise ValueError(
                f"device={device!r}: the trace records CPU or CUDA memory ('cpu', 'cuda:N')"
            )
        self.cuda = key.startswith("cuda")
        if self.cuda:
            from ._torch import cuda_index_exists

            cuda_index_exists(int(key[5:]), f"device={device!r}")
        self.device = key
        self.max_entries = max_entries
        self.model = model
        self.tag_modules = tag_modules
        # None: default_exclude() when the result is made; one str is one path part.
        self.exclude = None if exclude is None else _exclude_parts(exclude)
        self.paths = _paths(paths)
        self.result: TraceResult | None = None
        self._running = False
        self._we_enabled = False
        self._start: dict[str, Any] = {}
        self._names: list[list[Any]] = []
        self._cwd: str | None = None
        self._tagger: Any = None

    def start(self) -> Tracer:
        """Start recording. A start that fails (another tagger installed, an interrupt)
        undoes what it did: no recording, history setting or hook of it stays behind."""
        if self._running:
            raise RuntimeError("this Tracer is already recording; stop() it first")
        undo: list[Callable[[], object]] = []
        self._cwd = _cwd()  # what short paths are relative to, wherever the result is read
        try:
            if self.cuda:
                from ._sources import cuda_history as _cuda_history

                _cuda_history.ensure_initialised()
                self._names = start_names(self.model, self.device)
                self._we_enabled = not _cuda_history.history_enabled()
                if self._we_enabled:
                    _cuda_history.enable(self.max_entries)
                    undo.append(_cuda_history.disable)
                self._start = _cuda_history.start_layout()
            else:
                self._names = start_names(self.model, self.device)
                _core._cpu_trace_start(self.max_entries)
                undo.append(_core._cpu_trace_stop)
            if self.tag_modules:
                self._start_tagger()  # a tagger that fails to install removes itself
        except BaseException:
            self._tagger = None
            self._we_enabled = False
            for step in reversed(undo):
                step()
            raise
        self._running = True
        return self

    def _start_tagger(self) -> None:
        from ._trace_tags import ModuleTagger

        self._tagger = ModuleTagger(self.model, backward=self.tag_modules is True)
        self._tagger.install()

    def stop(self) -> TraceResult:
        if not self._running:
            raise RuntimeError("this Tracer is not recording; start() it first")
        self._running = False
        if self._tagger is not None:
            self._tagger.uninstall()
            self._tagger = None
        if self.cuda:
            from ._sources import cuda_history as _cuda_history

            try:
                snapshot = _cuda_history.snapshot()
            finally:
                if self._we_enabled:
                    _cuda_history.disable()
            snapshot["memlab_rs"] = {
                "version": 1,
                "source": "cuda",
                "device": self.device,
                "start": self._start,
            }
        else:
            snapshot = _core._cpu_trace_stop()
        # What was alive at the start, by tensor: the module view's untraced:<name> rows.
        snapshot["memlab_rs"]["start"]["names"] = self._names
        snapshot["memlab_rs"]["cwd"] = self._cwd
        self._names = []
        meta = results.run_meta(self.device)
        self.result = TraceResult(snapshot, self.exclude, meta, self.paths)
        return self.result

    def __enter__(self) -> Tracer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the peak tracer's module-level API ---------------------------------------------------
_global: Tracer | None = None
_last: TraceResult | None = None


def switch_allocator() -> None:
    """Kept for the peak tracer's users: a no-op. memlab_rs reads torch's own allocation
    history, so the caching allocator stays in place."""


def start_tracing(device: Any = None, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
    """Start recording (the peak tracer's name for ``Tracer().start()``)."""
    global _global
    if _global is not None:
        raise RuntimeError("tracing is already on; call stop_tracing() first")
    _global = Tracer(device=device, max_entries=max_entries).start()


def stop_tracing() -> TraceResult:
    """Stop recording and keep the result for ``report_stats()``."""
    global _global, _last
    if _global is None:
        raise RuntimeError("tracing is not on; call start_tracing() first")
    tracer, _global = _global, None
    _last = tracer.stop()
    return _last


def report_stats() -> None:
    """Print ``Max mem``, ``Total mem allocated`` and the rows of the last traced region."""
    if _last is None:
        raise RuntimeError("nothing traced yet: start_tracing(), run, stop_tracing()")
    _last.report_stats()
