"""The result kinds whose rooms do not render through ``results.Result.render`` yet: what
each renders as, and through which of its methods.

A kind's room moves its result to the one result model (data made by Rust, ``_rust`` set,
``render(format, **view)`` in the formats of ``_formats``); from then on ``_output`` asks
the result itself and the kind's entry here is dead. Delete this module when every room has
moved (issue 21); nothing else refers to it but ``_output``.
"""

from __future__ import annotations

from typing import Any

#: kind -> {format: the result's method that renders it, called with the view's options}.
#: Written out rather than guessed from what methods a result happens to have.
_METHODS: dict[str, dict[str, str]] = {
    "line_profile": {"text": "text", "html": "html", "csv": "to_csv"},
    "merged_line_profile": {"text": "text", "html": "html", "csv": "to_csv"},
}


def applies(result: Any) -> bool:
    """Whether ``result``'s kind still renders through its own methods."""
    return getattr(result, "_rust", None) is None and result.kind in _METHODS


def formats(result: Any) -> tuple[str, ...]:
    return tuple(_METHODS[result.kind])


def render(result: Any, form: str, view: dict[str, Any]) -> str:
    return str(getattr(result, _METHODS[result.kind][form])(**view))
