"""Line profiles of several ranks merged line by line (kind ``merged_line_profile``): per
line the minimum, median and maximum of each column across ranks and the rank holding the
maximum, so that an imbalance (one rank holding the whole optimizer state, say) stands out.
``memlab_rs.merge_results`` (in ``results.merge``) reaches it through the merge registered
below; the merge, the text, HTML, records and CSV are the Rust core's
(``src/line_profiler/merge.rs``, ``render/merged*.rs``).

>>> import torch, memlab_rs
>>> def f(n):
...     x = torch.zeros(n, 1024)
>>> profiles = []
>>> for n in (256, 512):                  # two "ranks": the second allocates twice as much
...     with memlab_rs.LineProfiler(f, device="cpu") as profiler:
...         f(n)
...     profiles.append(profiler.result())
>>> merged = memlab_rs.merge_results(profiles, ranks=[0, 1])
>>> column = "allocated_bytes.all.allocated"      # bytes each line allocated
>>> row = merged.records(columns=[column])[1]
>>> row["code"], row[f"{column}.rank0"], row[f"{column}.rank1"]
('    x = torch.zeros(n, 1024)', 1048576, 2097152)
>>> row[f"{column}.max_rank"]
1
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from memlab_rs import _core, results
from memlab_rs.line_profiler.columns import DEFAULT_COLUMNS
from memlab_rs.line_profiler.display import table_records
from memlab_rs.line_profiler.result import LineProfileResult
from memlab_rs.line_profiler.view import view_json, with_default_columns
from memlab_rs.results.merge import register_merge


class _Rust:
    """The Rust side of a merged line profile, as ``results.Result`` calls it."""

    validate = staticmethod(_core.line_profiler.merged_validate)
    render = staticmethod(_core.line_profiler.merged_render)


class MergedLineProfile(results.SavedResult):
    """Line profiles of several ranks, line by line: each column's value on each rank.

    ``records()`` gives, per source line, each column's ``min``, ``median``, ``max``,
    ``max_rank`` and per-rank value (``<column>.rank<R>``); the text and HTML show min,
    median, max and the rank holding the max where the ranks differ.

    >>> import memlab_rs
    >>> empty = memlab_rs.LineProfiler(device="cpu").result()
    >>> memlab_rs.merge_results([empty, empty], ranks=[0, 1]).text().splitlines()[0]
    '# merged line profile: ranks 0, 1 of 2'
    """

    kind = "merged_line_profile"
    _rust = _Rust
    _formats = ("text", "html", "csv", "json")

    def __init__(
        self,
        columns: list[str],
        ranks: list[int],
        world_size: int,
        functions: list[dict[str, Any]],
        notices: list[str],
        meta: dict[str, Any],
    ):
        data = {
            "columns": list(columns),
            "ranks": list(ranks),
            "world_size": world_size,
            "functions": functions,
            "notices": list(notices),
        }
        self._set_data(data, meta)

    @classmethod
    def _merge(
        cls, profiles: list[LineProfileResult], ranks: list[int], world: int, meta: dict
    ) -> MergedLineProfile:
        merged = _core.line_profiler.merge([p.data_json() for p in profiles], ranks, world)
        return cls._from_json(merged, meta)

    @property
    def columns(self) -> list[str]:
        """The columns every rank's profile has."""
        return list(self.to_data()["columns"])

    @property
    def ranks(self) -> list[int]:
        """The ranks merged, in order."""
        return list(self.to_data()["ranks"])

    @property
    def world_size(self) -> int:
        """The number of processes of the job."""
        return int(self.to_data()["world_size"])

    @property
    def blocks(self) -> list[dict[str, Any]]:
        """One dict per function: qualname, filename, and its lines, each [line number,
        source text, hits per rank, values per rank (one list per rank, or None)]."""
        return list(self.to_data()["functions"])

    @property
    def notices(self) -> list[str]:
        """Every rank's notices, each as ``rank R: ...``."""
        return list(self.to_data()["notices"])

    @property
    def functions(self) -> list[str]:
        """The qualified names of the functions, in report order."""
        return [b["qualname"] for b in self.blocks]

    def records(
        self, func: Any = None, columns: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        """One dict per source line: function, line, code, ``hits.min``/``hits.max``, and
        for each column (every column by default) ``<column>.min``, ``.median``, ``.max``,
        ``.max_rank`` and ``.rank<R>`` for each rank (None where a rank never ran it)."""
        view = self._view_json({"func": func, "columns": columns})
        return table_records(_core.line_profiler.merged_records(self._json, view))

    def text(self, func: Any = None, columns: Sequence[str] | None = DEFAULT_COLUMNS) -> str:
        """The merged report as text: per function, each column's min, median and max
        across ranks, and the rank holding the max where the ranks differ."""
        return self.render("text", func=func, columns=columns)

    def html(self, func: Any = None, columns: Sequence[str] | None = DEFAULT_COLUMNS) -> str:
        """The merged report as a self-contained HTML fragment."""
        return self.render("html", func=func, columns=columns)

    def to_csv(
        self,
        path: str | os.PathLike[str] | None = None,
        func: Any = None,
        columns: Sequence[str] | None = None,
    ) -> str:
        """The records as CSV (also written to ``path`` when given)."""
        return results.write_text(self.render("csv", func=func, columns=columns), path)

    def to_data(self) -> dict[str, Any]:
        """The merged profile as JSON values (the saved file's ``data``)."""
        return super().to_data()

    def _view_json(self, view: dict[str, Any], format: str | None = None) -> str:
        # Without columns, a format shows what its own method does (text() and html(): the
        # default columns; to_csv(): every column), so that render(format) is that method.
        view = with_default_columns(format, view)
        unknown = sorted(set(view) - {"func", "columns"})
        if unknown:
            raise TypeError(f"a merged line profile's view takes func and columns, got {unknown}")
        # A column error speaks of the CPU source when every rank profiled the CPU.
        devices = [i.get("device") for i in self.meta.get("inputs", [])]
        device = "cpu" if all(str(d).startswith("cpu") for d in devices) else None
        return view_json(view.get("func"), view.get("columns"), device)


results.register(MergedLineProfile.kind, MergedLineProfile.from_data)
register_merge("line_profile", MergedLineProfile._merge)
