"""Two results of one kind -> what grew and what shrank: a regression check between runs.

``diff_results(a, b)`` checks what it is given (two results of one kind, or their files)
and hands them to the diff of their kind, which each room registers (``register_diff``):
line profiles line by line, tensor reports tensor by tensor. Either returns a
``ResultDiff``: plain data that renders as text (what grew, then what shrank, largest first,
and the totals), CSV and JSON. ``regressions(over)`` lists what grew by more than ``over``
bytes, the check ``memlab-rs diff --fail-over`` turns into an exit status.

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
from typing import Any, Callable

from .. import _args
from .._core import readable_size
from . import files
from .writing import write_csv

#: The columns a line-profile diff compares by default (the line profiler's defaults).
DEFAULT_COLUMNS = ("active_bytes.all.peak", "reserved_bytes.all.peak")

#: kind -> its diff: (a, b, their names, the columns asked for) -> a ResultDiff.
DIFFERS: dict[str, Callable[[Any, Any, list[str], Any], Any]] = {}


def register_diff(kind: str, diff: Callable[[Any, Any, list[str], Any], Any]) -> None:
    """Make ``diff_results`` compare results of ``kind`` with ``diff``."""
    DIFFERS[kind] = diff


def diff_results(a: Any, b: Any, columns: Sequence[str] | None = DEFAULT_COLUMNS) -> ResultDiff:
    """What changed from ``a`` to ``b`` (result objects, or paths of saved result files) of
    one kind: two line profiles (``columns``: the columns compared; the default columns
    both have by default, None for every column both have) or two tensor reports.

    A line or tensor found in one result only counts as 0 in the other.

    >>> import torch, memlab_rs
    >>> before = memlab_rs.MemReporter().collect(device="cpu")
    >>> kept = torch.zeros(333, 777)  # a shape no other tensor alive has: rows are by shape
    >>> after = memlab_rs.MemReporter().collect(device="cpu")
    >>> [r["change"] for r in diff_results(before, after).rows if r["shape"] == "(333, 777)"]
    [1034964]
    """
    names = []
    loaded = []
    for parameter, item in (("a", a), ("b", b)):
        if isinstance(item, (str, os.PathLike)):
            names.append(_args.path(item, parameter))
            loaded.append(files.load(item))
        else:
            files.check_result(item, parameter)
            names.append("A" if not names else "B")
            loaded.append(item)
    kinds = [getattr(r, "kind", type(r).__name__) for r in loaded]
    if kinds[0] != kinds[1]:
        raise ValueError(
            f"diff: {names[0]} is a {kinds[0]} and {names[1]} a {kinds[1]}; "
            "diff compares two results of one kind"
        )
    if kinds[0] not in DIFFERS:
        files._import_kinds()  # the rooms register their kinds' diffs on import
    if kinds[0] not in DIFFERS:
        compared = " and ".join(sorted(DIFFERS)) or "none"
        raise ValueError(f"diff: {kinds[0]} results are not compared (these are: {compared})")
    return DIFFERS[kinds[0]](loaded[0], loaded[1], names, columns)


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

    def regressions(self, over: int | str = 0) -> list[dict[str, Any]]:
        """The rows that grew by more than ``over``, largest first: bytes, or a size as
        every size memlab_rs takes (``"16M"``, ``"2 MiB"``, ``"2 MB"``: ``parse_size``)."""
        limit = _args.size(over, "over")
        grown = [r for r in self.rows if r["change"] > limit]
        return sorted(grown, key=lambda r: -r["change"])

    def where(self, row: dict[str, Any]) -> str:
        """One row's place, in words: ``step:8 (active_bytes.all.peak)``, ``extra (cpu)``."""
        return f"{row['name']} ({row['device']})"

    def text(self) -> str:
        """What grew and what shrank, largest first, under the totals."""
        a, b = self.names
        out = [f"# {self._what} diff: {a} -> {b}\n"]
        for total in self.totals:
            rows = [r for r in self.rows if r[self._group] == total[self._group]]
            out.append(f"\n## {self._total_line(total)}\n")
            grew = [r for r in rows if r["change"] > 0]
            shrank = [r for r in rows if r["change"] < 0]
            for title, part in (("grew", grew), ("shrank", shrank)):
                if part:
                    out.append(f"{title}:\n")
                    out += [self._row_line(r) for r in part]
            if not rows:
                out.append("no change\n")
        if not self.totals:
            out.append("\nnothing to compare\n")
        return "".join(out)

    def to_data(self) -> dict[str, Any]:
        """The diff as JSON values."""
        return {"kind": self.kind, "names": self.names, "rows": self.rows, "totals": self.totals}

    def to_csv(self, path: str | os.PathLike[str] | None = None) -> str:
        """The rows as CSV (also written to ``path`` when given)."""
        return write_csv(self.rows, path)

    def __str__(self) -> str:
        return self.text()

    __repr__ = __str__

    # The forms below are a tensor report's: a kind whose room renders its own diff
    # subclasses ResultDiff (the line profiler's LineProfileDiff renders in Rust) and
    # overrides ``where`` and ``text``; these stay until the tensor report's room does.

    #: What the heading calls the results, and the key rows are grouped by (a total's).
    _what = "tensor report"
    _group = "device"

    def _total_line(self, total: dict[str, Any]) -> str:
        return (
            f"{total['device']}: {readable_size(total['a'])} -> {readable_size(total['b'])} "
            f"({_signed(total['change'])})"
        )

    def _row_line(self, row: dict[str, Any]) -> str:
        sizes = f"{_size(row['a'])} -> {_size(row['b'])}"
        return (
            f"  {_signed(row['change']):>10}  {row['name']}  {row['shape']} {row['dtype']}  "
            f"({sizes})\n"
        )


def _signed(n: int) -> str:
    return ("+" if n > 0 else "") + readable_size(n)


def _size(n: Any) -> str:
    return "-" if n is None else readable_size(n)
