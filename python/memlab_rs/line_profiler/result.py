"""A line profile as data: what ``LineProfiler.result()`` returns and ``load()`` rebuilds
(kind ``line_profile``).

It holds every column the profiler's source had, every profiled function that ran with
its source lines (read when the result was made, so a saved file renders without the
code), the notices, and where it was made (``meta``: device, rank, versions, time). Its
data is the Rust core's (``src/line_profiler/result.rs``), held as the JSON text that wrote
it; the text, HTML, records and CSV are rendered there, with any subset of its columns and
functions.

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

from memlab_rs import _core, results
from memlab_rs.line_profiler.columns import DEFAULT_COLUMNS
from memlab_rs.line_profiler.display import LineRecordsDisplay, table_records
from memlab_rs.line_profiler.view import view_json, with_default_columns


class LineProfileResult(results.SavedResult):
    """A line profile: plain data, rendered as pytorch_memlab's text or as HTML."""

    kind = "line_profile"
    _rust = _core.line_profiler
    _formats = ("text", "html", "csv", "json")

    def __init__(
        self,
        columns: list[str],
        functions: list[dict[str, Any]],
        notices: list[str],
        meta: dict[str, Any],
    ):
        data = {"columns": list(columns), "functions": functions, "notices": list(notices)}
        self._set_data(data, meta)

    @property
    def columns(self) -> list[str]:
        """Every column the profile holds, in order."""
        return list(self.to_data()["columns"])

    @property
    def blocks(self) -> list[dict[str, Any]]:
        """One dict per function that ran: qualname, filename, and its lines, each [line
        number, source text, hits, values (one per column) or None]."""
        return list(self.to_data()["functions"])

    @property
    def notices(self) -> list[str]:
        """Why the numbers may be incomplete, one line each."""
        return list(self.to_data()["notices"])

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
        view = _core.LineReportView(self._json, self._view(func, columns))
        return LineRecordsDisplay(view, results.rank_heading(self.meta))

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
        return table_records(self._rust.records(self._json, self._view(func, columns)))

    def to_csv(
        self,
        path: str | os.PathLike[str] | None = None,
        func: Any = None,
        columns: Sequence[str] | None = None,
    ) -> str:
        """The records as CSV (also written to ``path`` when given)."""
        return results.write_text(self.render("csv", func=func, columns=columns), path)

    def to_dataframe(self, func: Any = None, columns: Sequence[str] | None = None) -> Any:
        """The records as a pandas DataFrame (``pip install memlab_rs[pandas]``)."""
        return self.display(func, columns).to_dataframe()

    def _view(self, func: Any = None, columns: Any = None) -> str:
        return view_json(func, columns, self.device)

    def _view_json(self, view: dict[str, Any], format: str | None = None) -> str:
        # Without columns, a format shows what its own method does (text() and html(): the
        # default columns; to_csv(): every column), so that render(format) is that method.
        view = with_default_columns(format, view)
        unknown = sorted(set(view) - {"func", "columns"})
        if unknown:
            raise TypeError(f"a line profile's view takes func and columns, got {unknown}")
        return self._view(**view)


results.register(LineProfileResult.kind, LineProfileResult.from_data)
