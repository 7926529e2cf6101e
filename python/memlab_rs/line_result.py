"""A line profile as data: what ``LineProfiler.result()`` returns and ``load()`` rebuilds.

It holds every column the profiler's source had, every profiled function that ran with
its source lines (read when the result was made, so a saved file renders without the
code), the notices, and where it was made (``meta``: device, rank, versions, time). The
text and HTML reports are rendered from it, with any subset of its columns and functions.

>>> import torch, memlab_rs
>>> def f():
...     return torch.zeros(256, 1024)
>>> profiler = memlab_rs.LineProfiler(f, device="cpu")
>>> with profiler:
...     _ = f()
>>> result = profiler.result()
>>> result.functions
['f']
>>> memlab_rs.results.loads(memlab_rs.results.dumps(result)).text() == result.text()
True
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from . import _args, _core, results
from ._columns import check_saved_columns

DEFAULT_COLUMNS = ("active_bytes.all.peak", "reserved_bytes.all.peak")


class LineProfileResult(results.SavedResult):
    """A line profile: plain data, rendered as pytorch_memlab's text or as HTML."""

    kind = "line_profile"

    def __init__(
        self,
        columns: list[str],
        functions: list[dict[str, Any]],
        notices: list[str],
        meta: dict[str, Any],
    ):
        self.columns = list(columns)
        #: One dict per function that ran: qualname, filename, and its lines, each
        #: [line number, source text, hits, values (one per column) or None].
        self.blocks = functions
        self.notices = list(notices)
        self.meta = meta

    @classmethod
    def _from_view(
        cls, view: Any, filenames: dict[str, str], meta: dict[str, Any]
    ) -> LineProfileResult:
        columns, blocks, notices = view.data()
        functions = [
            {
                "qualname": qualname,
                "filename": filenames.get(qualname, ""),
                "lines": [list(line) for line in lines],
            }
            for qualname, lines in blocks
        ]
        return cls(columns, functions, notices, meta)

    @property
    def functions(self) -> list[str]:
        """The qualified names of the functions profiled, in report order."""
        return [b["qualname"] for b in self.blocks]

    @property
    def device(self) -> str | None:
        """The device profiled (``"cuda:0"``, ``"cpu"``)."""
        return self.meta.get("device")

    def display(
        self, func: Any = None, columns: Sequence[str] | None = DEFAULT_COLUMNS
    ) -> Any:
        """The report (``str()`` is the text, Jupyter shows HTML) of ``func`` (a qualname
        or a list of them; None for all) with ``columns`` (None: every saved column)."""
        from .line_profiler import LineRecordsDisplay

        return LineRecordsDisplay(self._view(func, columns), results.rank_heading(self.meta))

    def text(self, func: Any = None, columns: Sequence[str] | None = DEFAULT_COLUMNS) -> str:
        """pytorch_memlab's text report (under a line naming the rank, in a job of several
        processes)."""
        return str(self.display(func, columns))

    def html(self, func: Any = None, columns: Sequence[str] | None = DEFAULT_COLUMNS) -> str:
        """The self-contained HTML report."""
        return self.display(func, columns)._repr_html_()

    def records(
        self, func: Any = None, columns: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        """One dict per source line: function, line, hits, code and each column's value
        (None for lines that never ran); every saved column by default."""
        return self.display(func, columns).records()

    def to_csv(
        self,
        path: str | os.PathLike[str] | None = None,
        func: Any = None,
        columns: Sequence[str] | None = None,
    ) -> str:
        """The records as CSV (also written to ``path`` when given)."""
        names = ["function", "line", "hits", "code", *self._columns(columns)]
        return results.write_csv(self.records(func, columns), path, names)

    def to_dataframe(self, func: Any = None, columns: Sequence[str] | None = None) -> Any:
        """The records as a pandas DataFrame (``pip install memlab_rs[pandas]``)."""
        return self.display(func, columns).to_dataframe()

    def to_data(self) -> dict[str, Any]:
        """The result as JSON values (the saved file's ``data``)."""
        return {"columns": self.columns, "functions": self.blocks, "notices": self.notices}

    @classmethod
    def from_data(cls, data: dict[str, Any], meta: dict[str, Any]) -> LineProfileResult:
        """The result from a saved file's ``data`` and ``meta`` (checked by ``load``
        against ``_result_schema.LINE_PROFILE``)."""
        functions = [
            {
                "qualname": f["qualname"],
                "filename": f.get("filename", ""),
                "lines": [list(line) for line in f["lines"]],
            }
            for f in data["functions"]
        ]
        return cls(list(data["columns"]), functions, list(data["notices"]), meta)

    def _columns(self, columns: Sequence[str] | None) -> list[str]:
        if columns is None:
            return list(self.columns)
        return list(check_saved_columns(columns, self.columns, self.device))

    def _view(self, func: Any, columns: Sequence[str] | None) -> Any:
        wanted = self._columns(columns)
        indexes = [self.columns.index(c) for c in wanted]
        blocks = []
        for block in self._select(func):
            lines = [
                (ln, code, hits, None if values is None else [values[i] for i in indexes])
                for ln, code, hits, values in block["lines"]
            ]
            blocks.append((block["qualname"], lines))
        return _core.LineReportView.from_data(wanted, blocks, self.notices)

    def _select(self, func: Any) -> list[dict[str, Any]]:
        if func is None:
            return self.blocks
        chosen = []
        for name in wanted_functions(func):
            found = [b for b in self.blocks if b["qualname"] == name]
            if not found:
                have = ", ".join(self.functions) or "none"
                raise ValueError(f"no function {name!r} in this line profile (it has: {have})")
            chosen += [b for b in found if b not in chosen]
        return [b for b in self.blocks if b in chosen]


def wanted_functions(func: Any) -> list[str]:
    """The qualified names ``func`` asks for: a qualname, a function (its
    ``__qualname__``), or a list of them; a TypeError naming ``func`` otherwise.

    >>> def step(): ...
    >>> wanted_functions(step), wanted_functions(["a", "B.forward"])
    (['step'], ['a', 'B.forward'])
    """
    several = isinstance(func, (list, tuple, set, frozenset))
    items = func if several else [func]
    names = []
    for item in items:
        name = item if isinstance(item, str) else getattr(item, "__qualname__", None)
        if not isinstance(name, str):
            raise TypeError(
                "func must be a function, its qualified name, or a list of them, got "
                f"{_args.shown(item)} ({type(item).__name__})"
            )
        names.append(name)
    return names


results.register("line_profile", LineProfileResult.from_data)
