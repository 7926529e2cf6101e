"""Where every result writes text: CSV and plain text, to a path whole or not at all."""

from __future__ import annotations

import os
from typing import Any

from .. import _args
from . import atomic


def write_csv(
    records: list[dict[str, Any]],
    path: str | os.PathLike[str] | None = None,
    fieldnames: list[str] | None = None,
) -> str:
    """Records (dicts with the same keys) as CSV text, also written to ``path`` when given:
    the one CSV writer of every result's ``to_csv``.

    >>> write_csv([{"line": 3, "bytes": 1024}])
    'line,bytes\\n3,1024\\n'
    """
    import csv
    import io

    out = io.StringIO()
    names = fieldnames if fieldnames is not None else list(records[0]) if records else []
    if names:
        writer = csv.DictWriter(out, fieldnames=names, lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
    return write_text(out.getvalue(), path)


def write_text(text: str, path: str | os.PathLike[str] | None, name: str = "path") -> str:
    """Write ``text`` to the caller's ``path`` (nothing for None) and return it: where every
    ``to_csv(path)``, ``to_json(path)`` and the like write. A path that is not a str or
    ``os.PathLike`` is a TypeError naming ``name``: ``open(True)`` would write to standard
    output and close it.

    >>> write_text("a,b\\n", None)
    'a,b\\n'
    """
    if path is not None:
        atomic.write_text(_args.path(path, name), text, newline="")
    return text
