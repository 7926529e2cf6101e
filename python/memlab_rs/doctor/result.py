"""A post-mortem of an out-of-memory error (kind ``postmortem``): what was asked for, what
the device had, what was alive, and advice computed from those numbers. ``oom_guard`` writes
one at the failing allocation; ``memlab_rs.load`` reads it back; ``memlab-rs show`` prints it.
The Rust side is ``_core.doctor`` (``postmortem_*``)."""

from __future__ import annotations

import types
from typing import Any

from .. import _core, results


class PostMortemResult(results.Result):
    """One out-of-memory error explained, with exact bytes: ``request``, ``cuda`` (the
    device's figures) or ``host``, ``tensors`` (the live storages, biggest first), ``autograd``
    (what backward's graphs hold), ``by_line``/``by_module`` (with history), ``pools`` (free
    bytes per pool and stream) and ``advice``."""

    kind = "postmortem"
    _rust = types.SimpleNamespace(
        validate=_core.doctor.postmortem_validate, render=_core.doctor.postmortem_render
    )
    _formats = ("text", "summary", "html", "json")

    @classmethod
    def _from_facts(cls, facts: str, meta: dict[str, Any]) -> PostMortemResult:
        """The post-mortem from the facts gathered (JSON): Rust adds pools and advice."""
        return cls._from_json(_core.doctor.postmortem_complete(facts), meta)

    def summary(self) -> str:
        """The first lines: what failed, where, the device's figures, the advice."""
        return self.render("summary")

    @property
    def device(self) -> str:
        return str(self.to_data()["device"])

    @property
    def request(self) -> dict[str, Any]:
        return dict(self.to_data()["request"])

    @property
    def cuda(self) -> dict[str, Any] | None:
        return self.to_data()["cuda"]

    @property
    def tensors(self) -> list[dict[str, Any]]:
        return list(self.to_data()["tensors"])

    @property
    def advice(self) -> list[dict[str, Any]]:
        return list(self.to_data()["advice"])

    def advice_kinds(self) -> list[str]:
        """The kinds of advice given (``fragmentation``, ``expandable_segments``, ...)."""
        return [a["kind"] for a in self.advice]


results.register("postmortem", PostMortemResult.from_data)
