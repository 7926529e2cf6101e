"""Two tensor reports compared tensor by tensor (per name and device; a tensor nothing names
by device, shape and dtype): the change in bytes, and each device's totals.
``memlab_rs.diff_results`` reaches it through ``results.diff.register_diff``; the analysis
and the text run in Rust (``_core.tensor_report.diff``, ``diff_text``)."""

from __future__ import annotations

import json
from typing import Any

from .. import _core
from ..results.diff import ResultDiff, register_diff


class TensorReportDiff(ResultDiff):
    """What changed between two tensor reports: ``rows`` (name, device, shape, dtype, a, b,
    change; largest growth first, then the largest shrinking) and ``totals`` (per device:
    a, b, change).

    >>> import torch, memlab_rs
    >>> before = memlab_rs.MemReporter().collect(device="cpu")
    >>> kept = torch.zeros(512, 1021)
    >>> after = memlab_rs.MemReporter().collect(device="cpu")
    >>> change = memlab_rs.diff_results(before, after)
    >>> type(change).__name__
    'TensorReportDiff'
    >>> [(r["name"], r["change"]) for r in change.rows if r["shape"] == "(512, 1021)"]
    [('(unnamed)', 2091008)]
    """

    def where(self, row: dict[str, Any]) -> str:
        """One row's place, in words: ``extra (cpu)``."""
        return f"{row['name']} ({row['device']})"

    def text(self) -> str:
        """What grew and what shrank on each device, largest first, under its totals."""
        doc = {"names": self.names, "rows": self.rows, "totals": self.totals}
        return _core.tensor_report.diff_text(json.dumps(doc, allow_nan=False))


def tensor_diff(a: Any, b: Any, names: list[str], columns: Any = None) -> TensorReportDiff:
    """``diff_results``'s diff of two tensor reports (``columns`` is the line profiles')."""
    found = json.loads(_core.tensor_report.diff(a.data_json(), b.data_json()))
    return TensorReportDiff("tensor_report", names, found["rows"], found["totals"])


register_diff("tensor_report", tensor_diff)
