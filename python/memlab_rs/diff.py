"""Two results of one kind -> what grew and what shrank: a regression check between runs.

``diff_results(a, b)`` compares two line profiles line by line (per function, line number
and source text: the change of each column and of the hits) or two tensor reports tensor by
tensor (per name and device: the change in bytes) and returns a ``ResultDiff``: plain data
that renders as text (what grew, then what shrank, largest first, and the totals), CSV and
JSON. ``regressions(over)`` lists what grew by more than ``over`` bytes, the check
``memlab-rs diff --fail-over`` turns into an exit status.

>>> import torch, memlab_rs
>>> def f(n):
...     x = torch.zeros(n, 1024)
>>> runs = []
>>> for n in (256, 512):
...     with memlab_rs.LineProfiler(f, device="cpu") as profiler:
...         f(n)
...     runs.append(profiler.result())
>>> change = diff_results(*runs, columns=["allocated_bytes.all.allocated"])
>>> [(r["line"], r["a"], r["b"], r["change"]) for r in change.rows]
[(2, 1048576, 2097152, 1048576)]
>>> len(change.regressions(over=512 << 10))
1
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from . import results
from ._columns import check_saved_columns
from ._core import readable_size
from .line_result import DEFAULT_COLUMNS


def diff_results(a: Any, b: Any, columns: Sequence[str] | None = DEFAULT_COLUMNS) -> ResultDiff:
    """What changed from ``a`` to ``b`` (result objects, or paths of saved result files) of
    one kind: two line profiles (``columns``: the columns compared; the default columns
    both have by default, None for every column both have) or two tensor reports.

    A line or tensor found in one result only counts as 0 in the other.

    >>> import torch, memlab_rs
    >>> before = memlab_rs.MemReporter().collect(device="cpu")
    >>> kept = torch.zeros(512, 1024)
    >>> after = memlab_rs.MemReporter().collect(device="cpu")
    >>> [(r["a"], r["b"]) for r in diff_results(before, after).rows if r["b"] == 2 << 20]
    [(0, 2097152)]
    """
    names = []
    loaded = []
    for item in (a, b):
        if isinstance(item, (str, os.PathLike)):
            names.append(os.fspath(item))
            loaded.append(results.load(item))
        else:
            names.append("A" if not names else "B")
            loaded.append(item)
    kinds = [getattr(r, "kind", type(r).__name__) for r in loaded]
    if kinds[0] != kinds[1]:
        raise ValueError(
            f"diff: {names[0]} is a {kinds[0]} and {names[1]} a {kinds[1]}; "
            "diff compares two results of one kind"
        )
    if kinds[0] == "line_profile":
        return _line_diff(loaded[0], loaded[1], names, columns)
    if kinds[0] == "tensor_report":
        return _tensor_diff(loaded[0], loaded[1], names)
    raise ValueError(
        f"diff: {kinds[0]} results are not compared (line profiles and tensor reports are)"
    )


class ResultDiff:
    """The changes between two results: ``rows``, one dict per thing that changed, and
    ``totals``, one dict per column (line profiles) or device (tensor reports).

    >>> import memlab_rs
    >>> empty = memlab_rs.LineProfiler(device="cpu").result()
    >>> same = diff_results(empty, empty)
    >>> same.rows, same.totals[0]["column"], same.totals[0]["grew"]
    ([], 'active_bytes.all.peak', 0)
    """

    def __init__(
        self,
        kind: str,
        names: list[str],
        rows: list[dict[str, Any]],
        totals: list[dict[str, Any]],
    ):
        #: The kind of the two results compared.
        self.kind = kind
        #: The two results' names (file paths, or "A" and "B").
        self.names = names
        #: Line profiles: function, line, code, column, a, b, change, hits_a, hits_b.
        #: Tensor reports: name, device, shape, dtype, a, b, change. Largest growth first,
        #: then the largest shrinking; unchanged rows are left out.
        self.rows = rows
        #: Line profiles, per column: grew and shrank (counts of lines), largest_growth and
        #: largest_shrink (the row that changed most each way: function, line, change; None
        #: when none did), highest_a and highest_b (the largest value of any line), and
        #: functions: per function, a and b (the highest value of its lines: for a
        #: ``*.peak`` column, the function's peak; None where it has none) and change.
        #: Changes of different lines are never added up: peaks of different lines do not
        #: add. Tensor reports, per device: a, b and change (the totals, which do add: the
        #: tensors are held at once).
        self.totals = totals

    def regressions(self, over: int = 0) -> list[dict[str, Any]]:
        """The rows that grew by more than ``over`` bytes, largest first."""
        grown = [r for r in self.rows if r["change"] > over]
        return sorted(grown, key=lambda r: -r["change"])

    def where(self, row: dict[str, Any]) -> str:
        """One row's place, in words: ``step:8 (active_bytes.all.peak)``, ``extra (cpu)``."""
        if self.kind == "line_profile":
            return f"{row['function']}:{row['line']} ({row['column']})"
        return f"{row['name']} ({row['device']})"

    def text(self) -> str:
        """What grew and what shrank, largest first, under the totals."""
        a, b = self.names
        what = "line profile" if self.kind == "line_profile" else "tensor report"
        out = [f"# {what} diff: {a} -> {b}\n"]
        groups = self.totals
        key = "column" if self.kind == "line_profile" else "device"
        for total in groups:
            rows = [r for r in self.rows if r[key] == total[key]]
            out.append(f"\n## {self._total_line(total)}\n")
            grew = [r for r in rows if r["change"] > 0]
            shrank = [r for r in rows if r["change"] < 0]
            for title, part in (("grew", grew), ("shrank", shrank)):
                if part:
                    out.append(f"{title}:\n")
                    out += [self._row_line(r) for r in part]
            if not rows:
                out.append("no change\n")
        if not groups:
            out.append("\nnothing to compare\n")
        return "".join(out)

    def to_data(self) -> dict[str, Any]:
        """The diff as JSON values."""
        return {"kind": self.kind, "names": self.names, "rows": self.rows, "totals": self.totals}

    def to_csv(self, path: str | os.PathLike[str] | None = None) -> str:
        """The rows as CSV (also written to ``path`` when given)."""
        return results.write_csv(self.rows, path)

    def __str__(self) -> str:
        return self.text()

    __repr__ = __str__

    def _total_line(self, total: dict[str, Any]) -> str:
        if self.kind == "line_profile":
            lines = "line" if total["grew"] == 1 else "lines"
            said = (
                f"{total['column']}: {total['grew']} {lines} grew{_most(total['largest_growth'])}"
                f", {total['shrank']} shrank{_most(total['largest_shrink'])}"
            )
            what = "peak of" if total["column"].endswith(".peak") else "highest line of"
            for f in total["functions"]:
                change = f" ({_signed(f['change'])})" if f["change"] else ""
                said += f"\n{what} {f['function']}: {_size(f['a'])} -> {_size(f['b'])}{change}"
            return said
        return (
            f"{total['device']}: {readable_size(total['a'])} -> {readable_size(total['b'])} "
            f"({_signed(total['change'])})"
        )

    def _row_line(self, row: dict[str, Any]) -> str:
        sizes = f"{_size(row['a'])} -> {_size(row['b'])}"
        if self.kind == "line_profile":
            hits = ""
            if row["hits_a"] != row["hits_b"]:
                hits = f"  hits {row['hits_a'] or 0} -> {row['hits_b'] or 0}"
            where = f"{row['function']}:{row['line']}"
            code = row["code"].strip()
            return f"  {_signed(row['change']):>10}  {where}  {code}  ({sizes}){hits}\n"
        return (
            f"  {_signed(row['change']):>10}  {row['name']}  {row['shape']} {row['dtype']}  "
            f"({sizes})\n"
        )


def _line_diff(a: Any, b: Any, names: list[str], columns: Sequence[str] | None) -> ResultDiff:
    common = [c for c in a.columns if c in b.columns]
    if columns is None:
        wanted = common
    elif tuple(columns) == DEFAULT_COLUMNS:
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


def _most(place: dict[str, Any] | None) -> str:
    """``(the most +3.00M at step:8)``: the line that changed most one way."""
    if place is None:
        return ""
    return f" (the most {_signed(place['change'])} at {place['function']}:{place['line']})"


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


def _tensor_diff(a: Any, b: Any, names: list[str]) -> ResultDiff:
    rows_a, rows_b = _tensors(a), _tensors(b)
    keys = list(rows_a) + [k for k in rows_b if k not in rows_a]
    changed = []
    for key in keys:
        ra, rb = rows_a.get(key), rows_b.get(key)
        va = ra["bytes"] if ra else 0
        vb = rb["bytes"] if rb else 0
        if va != vb:
            shown = rb or ra
            assert shown is not None
            changed.append(
                {
                    "name": shown["name"],
                    "device": key[1],
                    "shape": shown["shape"],
                    "dtype": shown["dtype"],
                    "a": va,
                    "b": vb,
                    "change": vb - va,
                }
            )
    totals_a, totals_b = _device_totals(a), _device_totals(b)
    devices = list(totals_a) + [d for d in totals_b if d not in totals_a]
    totals = [
        {
            "device": d,
            "a": totals_a.get(d, 0),
            "b": totals_b.get(d, 0),
            "change": totals_b.get(d, 0) - totals_a.get(d, 0),
        }
        for d in devices
    ]
    return ResultDiff("tensor_report", names, _ordered(changed), totals)


def _tensors(report: Any) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Rows by name and device; tensors nothing names by device, shape and dtype (their
    numbered names depend on the order they were found in). Rows of one key add up."""
    from .merge import tensor_key

    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in report.rows:
        name, key = tensor_key(row.name, row.device, row.shape, row.dtype)
        if key in found:
            found[key]["bytes"] += int(row.bytes)
        else:
            found[key] = {
                "name": name,
                "bytes": int(row.bytes),
                "shape": str(row.shape),
                "dtype": row.dtype,
            }
    return found


def _device_totals(report: Any) -> dict[str, int]:
    return {s["device"]: int(s["total_bytes"]) for s in report.sections()}


def _ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Growth first, largest first; then shrinking, largest first."""
    return sorted(rows, key=lambda r: (r["change"] < 0, -abs(r["change"])))


def _signed(n: int) -> str:
    return ("+" if n > 0 else "") + readable_size(n)


def _size(n: Any) -> str:
    return "-" if n is None else readable_size(n)
