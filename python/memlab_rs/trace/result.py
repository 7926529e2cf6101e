"""A recording and its analysis: ``TraceResult`` (kind ``trace``) and the rows it gives
(``PeakRow``).

The analysis is Rust's (``_core.trace.TraceAnalysis``): it reads the snapshot once and keeps
the analysed report there, since a snapshot is often hundreds of MB; every answer crosses
as the JSON text of a serde struct (``src/trace/result.rs``), parsed here. The result saves
through ``results``' base (``Result``) as its snapshot with every frame and stack listed once
(``saved``), or as a snapshot pickle torch's tools read.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from .. import _args, _core, results
from .._torch import device_key
from ..results.atomic import atomic_open
from .options import analysis_options, exclude_parts, keyword_groups, paths_choice
from .plain_pickle import read_pickle


@dataclass(frozen=True)
class PeakRow:
    """One row of the peak table: the allocations of one location (or module) alive at the
    peak, their total, running total, median size and count."""

    location: str
    bytes: int
    cumulative: int
    median: int
    count: int


class TraceResult(results.Result):
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
    _rust = _core.trace
    _formats: ClassVar[tuple[str, ...]] = ("text", "html", "json", "csv", "untagged_log")

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
        self.exclude = exclude_parts(exclude)
        #: How files are shown: ``"short"`` or ``"full"`` (see ``Tracer``).
        self.paths = paths_choice(paths)
        self._analysis = _core.trace.TraceAnalysis(
            snapshot, analysis_options(self.exclude, self.paths)
        )
        self._about = json.loads(self._analysis.about())
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
        result._about = json.loads(analysis.about())
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
            self._snapshot = read_pickle(self._path)
        return self._snapshot

    # -- which device ------------------------------------------------------------------
    @property
    def source(self) -> str:
        """ "cuda" or "cpu"."""
        return str(self._about["source"])

    @property
    def devices(self) -> list[str]:
        """The devices with recorded allocations, e.g. ``["cuda:0"]`` or ``["cpu"]``."""
        return [d["name"] for d in self._about["devices"]]

    def _index(self, device: Any) -> int:
        indices = [int(d["index"]) for d in self._about["devices"]]
        if device is None:
            if not indices:
                raise ValueError("the trace recorded no allocations on any device")
            return indices[0]
        if self.source == "cpu":
            if device_key(device) != "cpu":
                raise ValueError(f"device={device!r}: this trace recorded CPU memory; use 'cpu'")
            return indices[0] if indices else 0
        key = device_key(device)
        if not key.startswith("cuda:"):
            raise ValueError(f"device={device!r}: this trace recorded CUDA memory; use 'cuda:N'")
        return int(key[5:])

    # -- numbers -------------------------------------------------------------------------
    def summary(self, device: Any = None) -> dict[str, int]:
        """The peak figures: ``max_mem`` (the highest allocated bytes, what
        ``max_memory_allocated`` reports over the region), ``total_allocated``,
        ``start_allocated``, ``end_allocated``, ``peak_time_us``, ``events``."""
        return dict(json.loads(self._analysis.summary(self._index(device))))

    def max_mem(self, device: Any = None) -> int:
        """The highest allocated bytes over the recording (`Max mem`)."""
        return int(self.summary(device)["max_mem"])

    def rows(self, device: Any = None) -> list[PeakRow]:
        """The allocations alive at the peak by location, biggest first; ``untraced`` is what
        was allocated before recording began. The rows add up to ``max_mem`` exactly."""
        return self._rows(device, "location")

    def module_rows(self, device: Any = None) -> list[PeakRow]:
        """The same live set by ``phase:module`` tag (forward, backward, optimizer): the
        recorded tag, else what the frames say, else ``(untagged)``; a phase with no module
        reads ``phase:(no module)``. Every module view (``module_text``, ``to_csv``,
        ``to_json``, HTML, ``keywords``, ``untagged_log``) reads this one grouping."""
        return self._rows(device, "module")

    def _rows(self, device: Any, by: str) -> list[PeakRow]:
        found = json.loads(self._analysis.rows(self._index(device), by))
        return [
            PeakRow(r["key"], r["bytes"], r["cumulative"], r["median"], r["count"]) for r in found
        ]

    def notices(self, device: Any = None) -> list[str]:
        """Why the result may be incomplete (also printed under the table)."""
        return list(json.loads(self._analysis.notices(self._index(device))))

    def line_peak_live(self, device: Any = None) -> dict[tuple[str, int], int]:
        """Bytes alive at the peak per ``(filename, line)``, callees included: what each
        line allocated that was still alive at the peak."""
        lines = json.loads(self._analysis.line_peak_live(self._index(device)))
        return {(line["filename"], line["line"]): line["bytes"] for line in lines}

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
        items = keyword_groups(groups)
        index = self._index(device)
        query = json.dumps({"groups": items, "by": by}, ensure_ascii=False)
        found = [(name, size) for name, size in json.loads(self._analysis.keywords(index, query))]
        tracked = self.max_mem(device)  # the rows add up to it
        expected = self._expected_sum(expected_sum, index, tracked, stacklevel + 1)
        if expected is not None:
            found.append(("Untrackable", expected - tracked))
        return found

    def _expected_sum(
        self, expected_sum: Any, index: int, tracked: int, stacklevel: int
    ) -> int | None:
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
        return self.render("text")

    def module_text(self) -> str:
        """The same table by module and phase."""
        return self.render("text", by="module")

    def report_stats(self) -> None:
        """Print the peak tracer's report."""
        print(self.text(), end="")

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """The report as JSON (figures, rows by location and module, notices)."""
        return results.write_text(self.render("json"), path)

    def to_dict(self) -> dict:
        return dict(json.loads(self.render("json")))

    def to_csv(self, path: str | os.PathLike | None = None, device: Any = None) -> str:
        """The tagging profiler's CSV: ``tag,MiB``, one row per tag alive at the peak."""
        return results.write_text(self.render("csv", device=device), path)

    def untagged_log(self, path: str | os.PathLike | None = None, device: Any = None) -> str:
        """The stacks of the allocations of the module view's ``(untagged)`` row (neither a
        tag nor their frames place them in a phase), biggest first; they add up to it."""
        return results.write_text(self.render("untagged_log", device=device), path)

    def render(self, format: str = "text", **view: Any) -> str:
        """The report in ``format``: ``text`` (the peak tracer's table; ``by="module"``
        for the module view), ``html``, ``json``, ``csv`` (the tagging profiler's, of
        ``device``) or ``untagged_log`` (of ``device``). Rendered from the analysis, which
        stays in Rust: the snapshot never crosses again."""
        if format not in self._formats:
            have = ", ".join(self._formats)
            raise ValueError(f"format={format!r}: a {self.kind} result renders as {have}")
        if "by" in view:
            _args.choice(view["by"], "by", ("location", "module"))
        if format in ("csv", "untagged_log"):
            view["device"] = self._index(view.get("device"))
        return str(self._analysis.render(format, json.dumps(view)))

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
        view = json.loads(self._analysis.timeline(self._index(device), top, max_points))
        view["layers"] = [(name, values) for name, values in view["layers"]]
        return dict(view)

    def timeline_html(self, path: str | os.PathLike | None = None, device: Any = None) -> str:
        """The timeline as one self-contained HTML file (no network needed to open it)."""
        # The view Rust made goes back as it came: checked and drawn there.
        view = self._analysis.timeline(self._index(device), 8, 2000)
        return results.write_text(_core.trace.timeline_html(view), path)

    def timeline_png(self, path: str | os.PathLike, device: Any = None) -> None:
        """The timeline as a PNG (needs matplotlib)."""
        from .plots import timeline_png

        timeline_png(self.timeline(device), path)

    def keyword_plot(
        self,
        path: str | os.PathLike,
        groups: Mapping[str, str | Sequence[str]],
        expected_sum: int | None | str = "driver",
        device: Any = None,
    ) -> None:
        """The tagging profiler's two-bar plot of the keyword groups (needs matplotlib)."""
        from .plots import keyword_plot_png

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
        from .saved import encode

        return {
            "source": self.source,
            "exclude": list(self.exclude),
            "paths": self.paths,
            **encode(self.snapshot),
        }

    def data_json(self) -> str:
        """The result's data as JSON text, as a saved file holds it (``to_data``)."""
        return json.dumps(
            self.to_data(), ensure_ascii=False, allow_nan=False, separators=(",", ":")
        )

    @classmethod
    def from_data(cls, data: dict[str, Any], meta: dict[str, Any]) -> TraceResult:
        """The result from a saved file's ``data`` and ``meta``: its fields checked by
        their derive (``_core.trace.validate``, a ValueError naming the field), the
        snapshot by the trace reader that analyses it."""
        from .saved import decode

        # Everything but the snapshot, which only the reader goes through (it is most of
        # the file, in torch's own schema).
        fields = {key: value for key, value in data.items() if key != "snapshot"}
        _core.trace.validate(json.dumps(fields, ensure_ascii=False, allow_nan=False))
        source = data["source"]
        paths = data.get("paths", "short")  # files saved before paths= read as short
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
        from .memory_viz import export_memory_viz

        export_memory_viz(self.snapshot, path, format=format)

    def __repr__(self) -> str:
        parts = [f"{d}: max {self.max_mem(d)} bytes" for d in self.devices]
        return f"<TraceResult {self.source} {', '.join(parts) or 'empty'}>"


results.register("trace", TraceResult.from_data)


def _driver_used(index: int) -> int | None:
    """Bytes in use on a CUDA device by the driver's count (cudarc; None without a driver)."""
    found = _core.driver_device_memory(index) if _core.driver_available() else None
    return None if found is None else found[0]
