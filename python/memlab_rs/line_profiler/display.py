"""What ``LineProfiler.display()`` and ``LineProfileResult.display()`` return: a line
report, shown as pytorch_memlab's text (``str()``) or as HTML (Jupyter), with its records
as dicts or a DataFrame. The view (functions, columns) was applied by the Rust core once;
each form is rendered from it there."""

from __future__ import annotations

import json
from typing import Any

from memlab_rs import _core


class LineRecordsDisplay:
    """A line report: ``str()``/``repr()`` give pytorch_memlab's text, Jupyter shows HTML.

    >>> from memlab_rs import LineProfiler
    >>> shown = LineProfiler().display()
    >>> str(shown)
    'No data collected\\n'
    """

    def __init__(self, view: _core.LineReportView, heading: str | None = None):
        self._view = view
        #: Which rank the report comes from, in a job of several processes (else None).
        self.heading = heading

    def __repr__(self) -> str:
        text = self._view.render("text")
        return text if self.heading is None else f"# {self.heading}\n\n{text}"

    __str__ = __repr__

    def _repr_html_(self) -> str:
        html = self._view.render("html")
        if self.heading is None:
            return html
        from html import escape

        return f"<p><b>{escape(self.heading)}</b></p>\n{html}"

    @property
    def columns(self) -> list[str]:
        """The columns shown."""
        return self._view.columns

    @property
    def notices(self) -> list[str]:
        """Why the numbers may be incomplete, one line each (events dropped, errors met,
        threads whose tracer was replaced); empty when there is nothing to say. The text and
        HTML print them under the tables.

        >>> from memlab_rs import LineProfiler
        >>> LineProfiler().display().notices
        []
        """
        return self._view.notices

    def records(self) -> list[dict[str, Any]]:
        """One dict per source line: function, line, hits, code and each column's value.

        Values are None for lines that never ran.
        """
        return table_records(self._view.records())

    def to_dataframe(self):
        """The records as a pandas DataFrame (needs the ``pandas`` extra); the notices are in
        its ``attrs["notices"]``."""
        import pandas as pd

        frame = pd.DataFrame(self.records())
        frame.attrs["notices"] = self.notices
        return frame


def table_records(table_json: str) -> list[dict[str, Any]]:
    """Records from the Rust core's table (``{"names": [...], "rows": [[...], ...]}``), one
    dict per row, keyed in the table's order.

    >>> table_records('{"names": ["line", "hits"], "rows": [[3, 1]]}')
    [{'line': 3, 'hits': 1}]
    """
    table = json.loads(table_json)
    names = table["names"]
    return [dict(zip(names, row)) for row in table["rows"]]
