"""Results as data: every tool's result saves to, and loads from, one JSON format; one base
class (``Result``) gives each kind its save, text, HTML and Jupyter display.

- ``files``: the result file (envelope, schema, load, gzip and JSON read with bounds);
- ``meta``: where and when a result was made;
- ``base``: the base class of every result kind (``Result``: data made by Rust, held
  as the JSON text its serde derive writes);
- ``writing`` and ``atomic``: text written whole or not at all.
"""

from .base import Result, SavedResult
from .files import (
    FORMAT,
    KINDS,
    SCHEMA,
    check_result,
    document,
    dumps,
    from_document,
    load,
    loads,
    parse_json,
    read_document,
    register,
    save,
)
from .meta import rank_heading, rank_info, run_meta
from .writing import write_csv, write_text

__all__ = [
    "FORMAT",
    "KINDS",
    "SCHEMA",
    "Result",
    "SavedResult",
    "check_result",
    "document",
    "dumps",
    "from_document",
    "load",
    "loads",
    "parse_json",
    "rank_heading",
    "rank_info",
    "read_document",
    "register",
    "run_meta",
    "save",
    "write_csv",
    "write_text",
]
