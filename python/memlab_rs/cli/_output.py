"""A saved result read (``load``), rendered in an output format (``formatted``), and the text
written (``write``): what ``show`` and ``merge`` print through.

Every result renders through the one result model: ``render(format, **view)``, in the
formats its kind says it has (``formats``). JSON is the result file's document, which every
kind has.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from .command import CliError, ReaderGone


def load(path: str) -> Any:
    """The result in the file at ``path``: a result file of any kind, or a trace snapshot
    pickle (``TraceResult.save("x.pickle")``, ``torch.cuda.memory._dump_snapshot``)."""
    from .. import results

    if not os.path.exists(path):
        raise CliError(f"{path}: no such file")
    if path.endswith((".pickle", ".pkl")):
        from .. import trace

        return trace.load(path)
    return results.load(path)


def formatted(result: Any, form: str, view: dict[str, Any]) -> str:
    """``result`` in the output format ``form`` (text, html, json or csv), with the line
    profile's ``view`` (columns, functions)."""
    from .. import results

    if form == "json":
        return results.dumps(result, indent=1) + "\n"
    have = formats(result)
    if form == "csv" and form not in have:
        raise CliError(f"a {result.kind} has no CSV form; use --format text, html or json")
    if form == "html":
        # A kind without an HTML form shows its text, as Jupyter does.
        rendered = render(result, "html" if "html" in have else "text", view)
        return rendered if rendered.endswith("\n") else rendered + "\n"
    return render(result, form, view)


def formats(result: Any) -> tuple[str, ...]:
    """The formats ``result``'s kind renders as (``results.Result._formats``)."""
    return tuple(result._formats)


def render(result: Any, form: str, view: dict[str, Any]) -> str:
    """``result`` in ``form``, through the one result model (every kind's room renders it)."""
    return str(result.render(form, **view))


def write(text: str, path: str | None = None, stream: TextIO | None = None) -> None:
    """``text`` to ``path`` (whole or not at all), else to ``stream`` (stdout by default);
    ``ReaderGone`` when the stream's reader has gone."""
    if path is not None:
        from ..results.atomic import write_text

        write_text(path, text)
        return
    stream = sys.stdout if stream is None else stream
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:  # `memlab-rs show ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())  # no error at exit
        raise ReaderGone from None
