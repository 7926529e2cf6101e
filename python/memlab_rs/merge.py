"""The merged tensor reports: tensor reports of several ranks tensor by tensor
(``MergedTensorReport``): per tensor the minimum, median and maximum bytes across ranks and
the rank holding the maximum, so that an imbalance (one rank holding the whole optimizer
state, say) stands out. ``memlab_rs.merge_results`` (in ``results.merge``) reaches it
through the merge registered below. (Line profiles merge in their room:
``memlab_rs.line_profiler.merged``.)
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Sequence
from typing import Any

from . import results
from ._core import readable_size
from .results.merge import register_merge, spread


class MergedTensorReport(results.SavedResult):
    """Tensor reports of several ranks, tensor by tensor: each tensor's bytes on each rank
    (0 where a rank does not hold it), keyed by name and device type (``cuda`` for every
    rank's own GPU).

    Rows are ordered by spread (max - min, the imbalance) then by size: the tensors only
    some ranks hold come first.

    >>> import torch, memlab_rs
    >>> report = memlab_rs.MemReporter().collect(device="cpu")
    >>> memlab_rs.merge_results([report, report], ranks=[0, 1]).kind
    'merged_tensor_report'
    """

    kind = "merged_tensor_report"

    def __init__(
        self,
        ranks: list[int],
        world_size: int,
        rows: list[dict[str, Any]],
        totals: dict[str, list[int]],
        meta: dict[str, Any],
    ):
        self.ranks = list(ranks)
        self.world_size = world_size
        #: One dict per tensor: name, device (type), shape, dtype, bytes (one per rank).
        self.rows = rows
        #: Per device type, the bytes of every tensor each rank's report covers.
        self.totals = totals
        self.meta = meta

    @classmethod
    def _merge(
        cls, reports: list[Any], ranks: list[int], world: int, meta: dict
    ) -> MergedTensorReport:
        n = len(reports)
        rows: dict[tuple[Any, ...], dict[str, Any]] = {}
        totals: dict[str, list[int]] = {}
        for i, report in enumerate(reports):
            for row in report.rows:
                kind = _device_type(row.device)
                shape = list(row.shape) if isinstance(row.shape, tuple) else row.shape
                name, key = tensor_key(row.name, kind, row.shape, row.dtype)
                if key not in rows:
                    rows[key] = {
                        "name": name,
                        "device": kind,
                        "shape": shape,
                        "dtype": row.dtype,
                        "bytes": [0] * n,
                    }
                rows[key]["bytes"][i] += int(row.bytes)
            for section in report.sections():
                kind = _device_type(section["device"])
                totals.setdefault(kind, [0] * n)[i] += int(section["total_bytes"])
        ordered = sorted(rows.values(), key=lambda r: _tensor_order(r["bytes"], r["name"]))
        return cls(ranks, world, ordered, totals, meta)

    def records(self) -> list[dict[str, Any]]:
        """One dict per tensor: name, device, shape, dtype, ``min``, ``median``, ``max``,
        ``max_rank`` and ``rank<R>`` (bytes on each rank)."""
        out = []
        for row in self.rows:
            record = {k: row[k] for k in ("name", "device", "dtype")}
            record["shape"] = _shape_text(row["shape"])
            record.update(spread(row["bytes"], self.ranks))
            for rank, value in zip(self.ranks, row["bytes"]):
                record[f"rank{rank}"] = value
            out.append(record)
        return out

    def text(self) -> str:
        """The merged report as text: per tensor, min, median and max bytes across ranks
        and the rank holding the max where the ranks differ; totals per device and rank."""
        heading = _ranks_heading("merged tensor report", self.ranks, self.world_size)
        head = ["name", "device", "shape", "dtype", "min", "median", "max", "max rank"]
        rows = [
            [r["name"], r["device"], _shape_text(r["shape"]), r["dtype"]]
            + _spread_cells(spread(r["bytes"], self.ranks))
            for r in self.rows
        ]
        for kind, per_rank in self.totals.items():
            rows.append(
                [f"total on {kind}", "", "", ""] + _spread_cells(spread(per_rank, self.ranks))
            )
        table = _text_table([head], rows, left=4)
        per = "; ".join(
            f"{kind}: " + ", ".join(f"rank {r} {readable_size(b)}" for r, b in zip(self.ranks, v))
            for kind, v in self.totals.items()
        )
        return f"# {heading}\n\n{table}\nper rank: {per}\n"

    def html(self) -> str:
        """The merged report as a self-contained HTML fragment."""
        heading = _ranks_heading("merged tensor report", self.ranks, self.world_size)
        head = ["name", "device", "shape", "dtype", "min", "median", "max", "max rank"]
        parts = [f'<div class="memlab-rs-merged"><p><b>{html.escape(heading)}</b></p><table>']
        parts.append("<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>")
        for r in self.rows:
            text = [r["name"], r["device"], _shape_text(r["shape"]), r["dtype"]]
            cells = [f"<td>{html.escape(str(c))}</td>" for c in text]
            cells += [
                f'<td align="right">{c}</td>' for c in _spread_cells(spread(r["bytes"], self.ranks))
            ]
            parts.append("<tr>" + "".join(cells) + "</tr>")
        for kind, per_rank in self.totals.items():
            cells = [f'<td colspan="4"><b>total on {html.escape(kind)}</b></td>']
            cells += [
                f'<td align="right">{c}</td>' for c in _spread_cells(spread(per_rank, self.ranks))
            ]
            parts.append("<tr>" + "".join(cells) + "</tr>")
        return "".join(parts) + "</table></div>"

    def to_csv(self, path: str | os.PathLike[str] | None = None) -> str:
        """The records as CSV (also written to ``path`` when given)."""
        return results.write_csv(self.records(), path)

    def to_data(self) -> dict[str, Any]:
        """The merged report as JSON values (the saved file's ``data``)."""
        return {
            "ranks": self.ranks,
            "world_size": self.world_size,
            "rows": self.rows,
            "totals": self.totals,
        }

    @classmethod
    def from_data(cls, data: dict[str, Any], meta: dict[str, Any]) -> MergedTensorReport:
        """The merged report from a saved file's ``data`` and ``meta`` (checked by
        ``load`` against ``_result_schema.MERGED_TENSOR_REPORT``)."""
        rows = [
            {k: row[k] for k in ("name", "device", "shape", "dtype", "bytes")}
            for row in data["rows"]
        ]
        totals = {k: list(v) for k, v in data["totals"].items()}
        return cls(data["ranks"], data["world_size"], rows, totals, meta)


# The reporter calls a tensor nothing names after its type and the order it was found in
# (Tensor0, Parameter3): numbers that differ between ranks and runs.
_UNNAMED = re.compile(r"(?:\w*Tensor|Parameter|Buffer)\d+(?:\.grad)?")
UNNAMED = "(unnamed)"


def tensor_key(name: str, device: str, shape: Any, dtype: str) -> tuple[str, tuple[Any, ...]]:
    """(the name shown, the key rows are matched by) of a tensor report's row: its name
    and device, or for a tensor nothing names, ``(unnamed)`` with its device, shape and
    dtype, so that unnamed tensors are matched by what they are, not by the order the
    reporter found them in.

    >>> tensor_key("model.fc.weight", "cpu", (4, 4), "torch.float32")
    ('model.fc.weight', ('model.fc.weight', 'cpu'))
    >>> tensor_key("Tensor7", "cpu", (4, 4), "torch.float32")
    ('(unnamed)', ('(unnamed)', 'cpu', '(4, 4)', 'torch.float32'))
    """
    if _UNNAMED.fullmatch(name):
        return UNNAMED, (
            UNNAMED,
            device,
            str(tuple(shape) if isinstance(shape, list) else shape),
            dtype,
        )
    return name, (name, device)


def _device_type(device: str) -> str:
    return str(device).partition(":")[0]


def _tensor_order(per_rank: list[int], name: str) -> tuple[int, int, str]:
    return (-(max(per_rank) - min(per_rank)), -max(per_rank), name)


def _shape_text(shape: Any) -> str:
    return str(tuple(shape)) if isinstance(shape, list) else str(shape)


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


results.register("merged_tensor_report", MergedTensorReport.from_data)


register_merge("tensor_report", MergedTensorReport._merge)
