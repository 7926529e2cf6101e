"""Two line profiles compared line by line (per function, line number and source text): the
change of each column and of the hits. ``memlab_rs.diff_results`` (in ``results.diff``)
reaches it through the diff registered below; the comparison and its text are the Rust
core's (``src/line_profiler/diff.rs``, ``render/diff_text.rs``).

>>> import torch, memlab_rs
>>> def f(n):
...     x = torch.zeros(n, 1024)
>>> runs = []
>>> for n in (256, 512):
...     with memlab_rs.LineProfiler(f, device="cpu") as profiler:
...         f(n)
...     runs.append(profiler.result())
>>> change = memlab_rs.diff_results(*runs, columns=["allocated_bytes.all.allocated"])
>>> type(change).__name__, change.where(change.rows[0])
('LineProfileDiff', 'f:2 (allocated_bytes.all.allocated)')
"""

from __future__ import annotations

import json
from typing import Any

from memlab_rs import _core
from memlab_rs.line_profiler.view import view_json
from memlab_rs.results.diff import ResultDiff, register_diff


class LineProfileDiff(ResultDiff):
    """What changed from one line profile to another: ``rows``, one per line and column
    that changed (function, line, code, column, a, b, change, hits_a, hits_b), and
    ``totals``, one per column compared."""

    @classmethod
    def _compare(cls, a: Any, b: Any, names: list[str], columns: Any) -> LineProfileDiff:
        """``a`` -> ``b`` in ``columns`` of those both have (None: every one; the defaults:
        those of them both have, else the first)."""
        view = view_json(None, columns, a.device)
        data = json.loads(_core.line_profiler.diff(a.data_json(), b.data_json(), names, view))
        return cls(data["kind"], data["names"], data["rows"], data["totals"])

    def where(self, row: dict[str, Any]) -> str:
        """One row's place, in words: ``step:8 (active_bytes.all.peak)``."""
        return f"{row['function']}:{row['line']} ({row['column']})"

    def text(self) -> str:
        """Per column, how many lines grew and shrank and each function's highest line on
        either side (its peak, for a ``*.peak`` column); then what grew and what shrank,
        largest first."""
        data = json.dumps(self.to_data(), ensure_ascii=False)
        return _core.line_profiler.diff_render(data, "text")


register_diff("line_profile", LineProfileDiff._compare)
