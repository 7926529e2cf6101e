"""The what-if plan as data (kind ``plan``): its fields are the serde struct of
``src/estimate/plan/result.rs``; Rust finds the choice that saves the most and renders the
table (``_core.estimate.plan_*``)."""

from __future__ import annotations

import types
from typing import Any

from .. import _core, results


class MemoryPlan(results.Result):
    """A what-if plan: ``rows`` (the baseline first, then each choice changed alone, with
    ``peak_allocated``, ``peak_reserved`` and ``largest_size`` under the ``budget``, or the
    ``error`` that stopped its estimate) and ``best`` (the row that saves the most).
    ``text()`` is the table; ``save(path)`` writes a ``plan`` result file."""

    kind = "plan"
    _rust = types.SimpleNamespace(
        validate=_core.estimate.plan_validate, render=_core.estimate.plan_render
    )
    _formats = ("text", "json")

    @property
    def rows(self) -> list[dict[str, Any]]:
        return list(self.to_data()["rows"])

    @property
    def budget(self) -> int | None:
        return self.to_data()["budget"]

    @property
    def best(self) -> dict[str, Any] | None:
        """The row that lowers the peak reserved the most (not a smaller size), if any."""
        index = self.to_data()["best"]
        return None if index is None else self.rows[index]

    @property
    def baseline(self) -> dict[str, Any]:
        return self.rows[0]

    def __str__(self) -> str:
        return self.text().rstrip("\n")


results.register("plan", MemoryPlan.from_data)
