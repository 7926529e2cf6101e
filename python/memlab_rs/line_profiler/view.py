"""A display's options (which functions, which columns) checked as Python values and put
into the one JSON object the Rust view reads; the Rust core applies them to the result
(``_core.line_profiler``: a function or column the result lacks is its ValueError)."""

from __future__ import annotations

import json
from typing import Any

from memlab_rs import _args
from memlab_rs.line_profiler.columns import DEFAULT_COLUMNS, column_names

#: The formats that show the default columns unless told otherwise (pytorch_memlab's report);
#: the others (CSV, records) hold every column.
_DEFAULT_COLUMNS_SHOWN = ("text", "html")


def with_default_columns(format: str | None, view: dict[str, Any]) -> dict[str, Any]:
    """``view`` with the columns ``format`` shows when the view names none: the default
    columns in text and HTML (as ``text()`` and ``html()`` show), every column in CSV and
    records (as ``to_csv()`` and ``records()`` give), so that ``render(format)`` is the
    format's own method.

    >>> with_default_columns("text", {"func": None})
    {'func': None, 'columns': ('active_bytes.all.peak', 'reserved_bytes.all.peak')}
    >>> with_default_columns("csv", {"func": None})
    {'func': None}
    """
    if "columns" in view or format not in _DEFAULT_COLUMNS_SHOWN:
        return view
    return {**view, "columns": DEFAULT_COLUMNS}


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


def view_json(func: Any = None, columns: Any = None, device: Any = None) -> str:
    """The view's JSON: ``func`` (None: every function), ``columns`` (None: every column)
    and the ``device`` the result was made on (what a column error says of its source).

    >>> view_json("step", ["active_bytes.all.peak"], "cpu")
    '{"func": ["step"], "columns": ["active_bytes.all.peak"], "device": "cpu"}'
    """
    return json.dumps(
        {
            "func": None if func is None else wanted_functions(func),
            "columns": None if columns is None else list(column_names(columns)),
            "device": device if isinstance(device, str) else None,
        }
    )
