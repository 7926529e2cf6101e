"""The diff of two line profiles, line by line (per function, line number and source text:
the change of each column and of the hits). ``memlab_rs.diff_results`` (in
``results.diff``) reaches it through the diff registered below; tensor reports are compared
in their room (``memlab_rs.tensor_report.diff``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._columns import check_saved_columns
from .line_result import DEFAULT_COLUMNS
from .results.diff import ResultDiff, register_diff


def _line_diff(a: Any, b: Any, names: list[str], columns: Sequence[str] | None) -> ResultDiff:
    common = [c for c in a.columns if c in b.columns]
    if columns is None:
        wanted = common
    elif isinstance(columns, (list, tuple)) and tuple(columns) == DEFAULT_COLUMNS:
        wanted = [c for c in columns if c in common] or common[:1]
    else:
        wanted = list(check_saved_columns(columns, common, a.device))
    lines_a, lines_b = _lines(a), _lines(b)
    keys = list(lines_a) + [k for k in lines_b if k not in lines_a]
    rows, totals = [], []
    for column in wanted:
        ia = a.columns.index(column)
        ib = b.columns.index(column)
        changed = []
        highest = [0, 0]
        for key in keys:
            hits_a, va = _value(lines_a.get(key), ia)
            hits_b, vb = _value(lines_b.get(key), ib)
            highest = [max(highest[0], va or 0), max(highest[1], vb or 0)]
            change = (vb or 0) - (va or 0)
            if change != 0:
                function, line, code = key
                changed.append(
                    {
                        "function": function,
                        "line": line,
                        "code": code.rstrip("\n"),
                        "column": column,
                        "a": va,
                        "b": vb,
                        "change": change,
                        "hits_a": hits_a,
                        "hits_b": hits_b,
                    }
                )
        rows += _ordered(changed)
        grew = [r for r in changed if r["change"] > 0]
        shrank = [r for r in changed if r["change"] < 0]
        totals.append(
            {
                "column": column,
                "grew": len(grew),
                "shrank": len(shrank),
                "largest_growth": _place(max(grew, key=lambda r: r["change"], default=None)),
                "largest_shrink": _place(min(shrank, key=lambda r: r["change"], default=None)),
                "highest_a": highest[0],
                "highest_b": highest[1],
                "functions": _function_highs(lines_a, lines_b, ia, ib),
            }
        )
    return ResultDiff("line_profile", names, rows, totals)


def _place(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {"function": row["function"], "line": row["line"], "change": row["change"]}


def _function_highs(
    lines_a: dict[tuple[str, int, str], tuple[int, Any]],
    lines_b: dict[tuple[str, int, str], tuple[int, Any]],
    ia: int,
    ib: int,
) -> list[dict[str, Any]]:
    """Per function (in report order), the highest value of its lines in A and in B: for
    a ``*.peak`` column the function's peak, every moment of it being some line's."""
    highs: dict[str, list[Any]] = {}
    for side, (found, index) in enumerate(((lines_a, ia), (lines_b, ib))):
        for (function, _line, _code), line in found.items():
            _hits, value = _value(line, index)
            high = highs.setdefault(function, [None, None])
            if value is not None and (high[side] is None or value > high[side]):
                high[side] = value
    return [
        {"function": f, "a": a, "b": b, "change": (b or 0) - (a or 0)}
        for f, (a, b) in highs.items()
    ]


def _lines(profile: Any) -> dict[tuple[str, int, str], tuple[int, Any]]:
    found = {}
    for block in profile.blocks:
        for ln, code, hits, values in block["lines"]:
            found[(block["qualname"], ln, code)] = (hits, values)
    return found


def _value(line: tuple[int, Any] | None, index: int) -> tuple[Any, Any]:
    if line is None:
        return None, None
    hits, values = line
    return hits, None if values is None else values[index]


def _ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Growth first, largest first; then shrinking, largest first."""
    return sorted(rows, key=lambda r: (r["change"] < 0, -abs(r["change"])))


register_diff("line_profile", _line_diff)
