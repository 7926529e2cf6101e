"""The merged line profile: line profiles of several ranks line by line
(``MergedLineProfile``): per line the minimum, median and maximum across ranks and the rank
holding the maximum, so that an imbalance (one rank holding the whole optimizer state, say)
stands out. ``memlab_rs.merge_results`` (in ``results.merge``) reaches it through the merge
registered below; tensor reports merge in their room (``memlab_rs.tensor_report.merged``).

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

import html
import os
from collections.abc import Sequence
from typing import Any

from . import results
from ._columns import check_saved_columns
from ._core import readable_size
from .line_result import DEFAULT_COLUMNS, LineProfileResult, wanted_functions
from .results.merge import Value, register_merge, spread


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

    def __init__(
        self,
        columns: list[str],
        ranks: list[int],
        world_size: int,
        functions: list[dict[str, Any]],
        notices: list[str],
        meta: dict[str, Any],
    ):
        self.columns = list(columns)
        self.ranks = list(ranks)
        self.world_size = world_size
        #: One dict per function: qualname, filename, and its lines, each [line number,
        #: source text, hits per rank, values per rank (one list per rank, or None)].
        self.blocks = functions
        self.notices = list(notices)
        self.meta = meta

    @classmethod
    def _merge(
        cls, profiles: list[LineProfileResult], ranks: list[int], world: int, meta: dict
    ) -> MergedLineProfile:
        columns = [c for c in profiles[0].columns if all(c in p.columns for p in profiles)]
        if not columns:
            raise ValueError("merge_results: the line profiles have no column in common")
        n = len(profiles)
        functions: dict[str, dict[str, Any]] = {}
        lines: dict[tuple[str, int, str], list[Any]] = {}
        for i, profile in enumerate(profiles):
            picks = [profile.columns.index(c) for c in columns]
            for block in profile.blocks:
                name = block["qualname"]
                functions.setdefault(name, {"qualname": name, "filename": block["filename"]})
                for ln, source, hits, values in block["lines"]:
                    code = source.rstrip("\r\n")
                    key = (name, ln, code)
                    if key not in lines:
                        lines[key] = [ln, code, [None] * n, [None] * n]
                    lines[key][2][i] = hits
                    lines[key][3][i] = None if values is None else [values[j] for j in picks]
        blocks = []
        for name, function in functions.items():
            own = sorted((v for k, v in lines.items() if k[0] == name), key=lambda v: v[0])
            blocks.append({**function, "lines": own})
        notices = [f"rank {r}: {text}" for r, p in zip(ranks, profiles) for text in p.notices]
        return cls(columns, ranks, world, blocks, notices, meta)

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
        wanted = self._columns(columns, every=True)
        out = []
        for block in self._select(func):
            for ln, code, hits, values in block["lines"]:
                counts = [h for h in hits if h is not None]
                record: dict[str, Any] = {
                    "function": block["qualname"],
                    "line": ln,
                    "code": code,
                    "hits.min": min(counts) if counts else None,
                    "hits.max": max(counts) if counts else None,
                }
                for column in wanted:
                    per_rank = self._per_rank(values, column)
                    for key, value in spread(per_rank, self.ranks).items():
                        record[f"{column}.{key}"] = value
                    for rank, value in zip(self.ranks, per_rank):
                        record[f"{column}.rank{rank}"] = value
                out.append(record)
        return out

    def text(self, func: Any = None, columns: Sequence[str] | None = DEFAULT_COLUMNS) -> str:
        """The merged report as text: per function, each column's min, median and max
        across ranks, and the rank holding the max where the ranks differ."""
        wanted = self._columns(columns)
        parts = [f"# {_ranks_heading('merged line profile', self.ranks, self.world_size)}\n"]
        head = ["min", "median", "max", "max rank"] * len(wanted) + ["line", "hits", "code"]
        for block in self._select(func):
            rows = []
            for ln, code, hits, values in block["lines"]:
                cells = []
                for column in wanted:
                    cells += _spread_cells(spread(self._per_rank(values, column), self.ranks))
                rows.append([*cells, str(ln), _hits_cell(hits), code.rstrip("\n")])
            parts.append(f"\n## {block['qualname']}\n\n")
            parts.append(_text_table([head], rows, left=0, groups=[(c, 4) for c in wanted]))
        parts += [f"{notice}\n" for notice in self.notices]
        return "".join(parts)

    def html(self, func: Any = None, columns: Sequence[str] | None = DEFAULT_COLUMNS) -> str:
        """The merged report as a self-contained HTML fragment."""
        wanted = self._columns(columns)
        heading = _ranks_heading("merged line profile", self.ranks, self.world_size)
        parts = [f'<div class="memlab-rs-merged"><p><b>{html.escape(heading)}</b></p>']
        for block in self._select(func):
            parts.append(f"<h4>{html.escape(block['qualname'])}</h4><table>")
            parts.append(
                "<tr>"
                + "".join(f'<th colspan="4">{html.escape(c)}</th>' for c in wanted)
                + "<th></th><th></th><th></th></tr><tr>"
                + "<th>min</th><th>median</th><th>max</th><th>max rank</th>" * len(wanted)
                + "<th>line</th><th>hits</th><th>code</th></tr>"
            )
            for ln, code, hits, values in block["lines"]:
                cells = []
                for column in wanted:
                    cells += _spread_cells(spread(self._per_rank(values, column), self.ranks))
                parts.append(
                    "<tr>"
                    + "".join(f'<td align="right">{c}</td>' for c in cells)
                    + f'<td align="right">{ln}</td><td>{_hits_cell(hits)}</td>'
                    + f"<td><pre>{html.escape(code.rstrip())}</pre></td></tr>"
                )
            parts.append("</table>")
        parts += [f"<p>{html.escape(n)}</p>" for n in self.notices]
        return "".join(parts) + "</div>"

    def to_csv(
        self,
        path: str | os.PathLike[str] | None = None,
        func: Any = None,
        columns: Sequence[str] | None = None,
    ) -> str:
        """The records as CSV (also written to ``path`` when given)."""
        return results.write_csv(self.records(func, columns), path)

    def to_data(self) -> dict[str, Any]:
        """The merged profile as JSON values (the saved file's ``data``)."""
        return {
            "columns": self.columns,
            "ranks": self.ranks,
            "world_size": self.world_size,
            "functions": self.blocks,
            "notices": self.notices,
        }

    @classmethod
    def from_data(cls, data: dict[str, Any], meta: dict[str, Any]) -> MergedLineProfile:
        """The merged profile from a saved file's ``data`` and ``meta`` (checked by
        ``load`` against ``_result_schema.MERGED_LINE_PROFILE``)."""
        functions = [
            {
                "qualname": f["qualname"],
                "filename": f["filename"],
                "lines": [[ln, code, list(hits), list(vs)] for ln, code, hits, vs in f["lines"]],
            }
            for f in data["functions"]
        ]
        return cls(
            data["columns"], data["ranks"], data["world_size"], functions, data["notices"], meta
        )

    def _per_rank(self, values: list[Any], column: str) -> list[Value]:
        index = self.columns.index(column)
        return [None if v is None else v[index] for v in values]

    def _columns(self, columns: Sequence[str] | None, every: bool = False) -> list[str]:
        if columns is None:
            return list(self.columns)
        if not every and isinstance(columns, (list, tuple)) and tuple(columns) == DEFAULT_COLUMNS:
            # the default view: the default columns this profile has (a CPU one has both)
            present = [c for c in columns if c in self.columns]
            return present or self.columns[:1]
        device = "cpu" if all(str(d).startswith("cpu") for d in _devices(self.meta)) else None
        return list(check_saved_columns(columns, self.columns, device))

    def _select(self, func: Any) -> list[dict[str, Any]]:
        if func is None:
            return self.blocks
        wanted = wanted_functions(func)
        for name in wanted:
            if name not in self.functions:
                have = ", ".join(self.functions) or "none"
                raise ValueError(f"no function {name!r} in this merged profile (it has: {have})")
        return [b for b in self.blocks if b["qualname"] in wanted]


def _devices(meta: dict[str, Any]) -> list[Any]:
    return [i.get("device") for i in meta.get("inputs", [])]


def _ranks_heading(what: str, ranks: list[int], world: int) -> str:
    listed = ", ".join(str(r) for r in ranks)
    return f"{what}: ranks {listed} of {world}"


def _spread_cells(found: dict[str, Any]) -> list[str]:
    """min, median, max as sizes, and the rank of the max only where the ranks differ."""
    if found["max"] is None:
        return ["", "", "", ""]
    sizes = [readable_size(found[k]) for k in ("min", "median", "max")]
    rank = "-" if found["min"] == found["max"] else str(found["max_rank"])
    return [*sizes, rank]


def _hits_cell(hits: list[Any]) -> str:
    counts = [h for h in hits if h is not None]
    if not counts:
        return ""
    low, high = min(counts), max(counts)
    return str(low) if low == high else f"{low}-{high}"


def _text_table(
    heads: list[list[str]],
    rows: list[list[str]],
    left: int,
    groups: Sequence[tuple[str, int]] = (),
) -> str:
    """Aligned columns: the first ``left`` columns and the last one left-aligned, the
    others right-aligned; the last column is not padded. ``groups``: a line above the
    heads labelling runs of columns, each (label, number of columns), from the first."""
    every = heads + rows
    widths = [max(len(r[i]) for r in every) for i in range(len(every[0]))]
    start = 0
    for label, count in groups:  # widen a group's last column to fit its label
        span = sum(widths[start : start + count]) + 2 * (count - 1)
        widths[start + count - 1] += max(0, len(label) - span)
        start += count
    out = []
    if groups:
        labels, start = [], 0
        for label, count in groups:
            span = sum(widths[start : start + count]) + 2 * (count - 1)
            labels.append(label.ljust(span))
            start += count
        out.append("  ".join(labels).rstrip() + "\n")
    for row in every:
        cells = []
        for i, cell in enumerate(row):
            if i == len(row) - 1:
                cells.append(cell)
            elif i < left:
                cells.append(cell.ljust(widths[i]))
            else:
                cells.append(cell.rjust(widths[i]))
        out.append("  ".join(cells).rstrip() + "\n")
    return "".join(out)


results.register("merged_line_profile", MergedLineProfile.from_data)


register_merge("line_profile", MergedLineProfile._merge)
