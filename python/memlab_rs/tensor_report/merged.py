"""Tensor reports of several ranks merged tensor by tensor (kind ``merged_tensor_report``):
per tensor the minimum, median and maximum bytes across ranks and the rank holding the
maximum, so that an imbalance (one rank holding the whole optimizer state, say) stands out.
The merge itself, the records and the renderings run in Rust
(``_core.merged_tensor_report``); ``memlab_rs.merge_results`` reaches the merge through
``results.merge.register_merge``."""

from __future__ import annotations

import json
import os
from typing import Any

from .. import _core, results
from ..results.merge import register_merge


class MergedTensorReport(results.Result):
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
    _rust = _core.merged_tensor_report
    _formats = ("text", "html", "csv")

    def __init__(
        self,
        ranks: list[int],
        world_size: int,
        rows: list[dict[str, Any]],
        totals: dict[str, list[int]],
        meta: dict[str, Any],
    ):
        data = {"ranks": ranks, "world_size": world_size, "rows": rows, "totals": totals}
        self._set_data(data, meta)

    @classmethod
    def _merge(
        cls, reports: list[Any], ranks: list[int], world: int, meta: dict[str, Any]
    ) -> MergedTensorReport:
        """The reports (ordered by rank) merged: ``merge_results``'s merge of the kind."""
        head = json.dumps({"ranks": ranks, "world_size": world})
        inputs = f'{head[:-1]}, "reports": [{",".join(r.data_json() for r in reports)}]}}'
        return cls._from_json(cls._rust.merge(inputs), meta)

    @property
    def ranks(self) -> list[int]:
        """The ranks merged, in order."""
        return list(self.to_data()["ranks"])

    @property
    def world_size(self) -> int:
        """The job's number of processes."""
        return int(self.to_data()["world_size"])

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One dict per tensor: name, device (type), shape, dtype, bytes (one per rank)."""
        return list(self.to_data()["rows"])

    @property
    def totals(self) -> dict[str, list[int]]:
        """Per device type, the bytes of every tensor each rank's report covers."""
        return dict(self.to_data()["totals"])

    def records(self) -> list[dict[str, Any]]:
        """One dict per tensor: name, device, shape, dtype, ``min``, ``median``, ``max``,
        ``max_rank`` and ``rank<R>`` (bytes on each rank)."""
        return json.loads(self._rust.records(self._json))

    def text(self) -> str:
        """The merged report as text: per tensor, min, median and max bytes across ranks
        and the rank holding the max where the ranks differ; totals per device and rank."""
        return self.render("text")

    def html(self) -> str:
        """The merged report as a self-contained HTML fragment."""
        return self.render("html")

    def to_csv(self, path: str | os.PathLike[str] | None = None) -> str:
        """The records as CSV (also written to ``path`` when given)."""
        return results.write_text(self.render("csv"), path)

    def to_data(self) -> dict[str, Any]:
        """The merged report as JSON values (the saved file's ``data``)."""
        return super().to_data()


results.register(MergedTensorReport.kind, MergedTensorReport.from_data)
register_merge("tensor_report", MergedTensorReport._merge)
