"""The schema of every saved result kind: the one place a loaded document is checked, field
by field, before any result class sees it.

A result file may come from anyone. Each kind's class used to trust its ``data`` (or check
some fields and not others), so a wrong type at one field surfaced anywhere later: a
``TypeError`` in a renderer, an ``OverflowError`` where a number reached Rust, an
``AttributeError`` in a merge. Here every field of every kind has a type and a range (the
range its renderer takes: byte counts fit in an i64, line numbers in a u32), and the few
rules between fields (one value per column, one entry per rank) are stated beside them.
``check(kind, data, meta)`` raises a ValueError naming the field, what it must be and what
it is; the kind's ``from_data`` then only builds. The later redesign turns these into
serde-typed Rust structs; until then they are written as data, in one file, to move there.

What is left to others: the syntax, nesting and numbers of the JSON text
(``_core.check_result_json``, before parsing), a trace's snapshot (torch's schema, read and
checked by the trace reader, ``src/trace/load.rs``), and what only the analysis can tell
(a trace whose ``source`` disagrees with its snapshot).

>>> check("tracker", {"rows": []}, {})
Traceback (most recent call last):
...
ValueError: tracker: no "total_bytes" field
"""

from __future__ import annotations

from typing import Any

from ._json_schema import (
    I64_MIN,
    RANK_MAX,
    U32_MAX,
    AnyObject,
    Bool,
    Either,
    Float,
    Int,
    List,
    Map,
    Obj,
    OneOf,
    Opt,
    Str,
    Tuple,
    shown,
)

# -- the types fields share ---------------------------------------------------------------------

BYTES = Int(0)  # byte counts and counts: the renderers take u64 or i64
SIGNED = Int(I64_MIN)  # a line's change: i64
LINE = Int(0, U32_MAX)
RANK = Int(0, RANK_MAX)
WORLD = Int(1, RANK_MAX + 1)
SECONDS = Float()
TEXT = Str()
TEXTS = List(TEXT)


def _unique_ranks(data: dict[str, Any], where: str) -> None:
    ranks = data["ranks"]
    if len(set(ranks)) != len(ranks):
        raise ValueError(f'{where}: "ranks" lists a rank twice: {shown(ranks)}')


# -- meta ----------------------------------------------------------------------------------------

META = Obj(
    "meta",
    {},
    optional={
        "memlab_rs": TEXT,
        "torch": TEXT,
        "python": TEXT,
        "platform": TEXT,
        "host": TEXT,
        "pid": BYTES,
        "argv": TEXTS,
        "created": TEXT,
        "device": Opt(TEXT),
        "rank": RANK,
        "world_size": WORLD,
        "local_rank": RANK,
        "snapshot_file": TEXT,
        # a merged result's: the ranks merged and where each came from
        "ranks": List(RANK),
        "inputs": List(
            Obj(
                "meta input {i}",
                {},
                optional={
                    "rank": RANK,
                    "source": TEXT,
                    "device": Opt(TEXT),
                    "host": Opt(TEXT),
                    "pid": Opt(BYTES),
                    "created": Opt(TEXT),
                    "local_rank": Opt(RANK),
                    "argv": Opt(TEXTS),
                },
            )
        ),
    },
)

# -- line profiles -------------------------------------------------------------------------------


def _values_per_column(data: dict[str, Any], where: str) -> None:
    width = len(data["columns"])
    for f in data["functions"]:
        for line in f["lines"]:
            values = line[3]
            if values is not None and len(values) != width:
                raise ValueError(
                    f"{where}: line {line[0]} of {f['qualname']}: {len(values)} values for "
                    f"{width} columns"
                )


LINE_PROFILE = Obj(
    "line_profile",
    {
        "columns": TEXTS,
        "functions": List(
            Obj(
                "line_profile function {i}",
                {
                    "qualname": TEXT,
                    "lines": List(
                        Tuple(
                            "[line, code, hits, values or null]",
                            LINE,
                            TEXT,
                            BYTES,
                            Opt(List(SIGNED)),
                        )
                    ),
                },
                optional={"filename": TEXT},
            )
        ),
        "notices": TEXTS,
    },
    rules=(_values_per_column,),
)


def _one_entry_per_rank(data: dict[str, Any], where: str) -> None:
    ranks, width = len(data["ranks"]), len(data["columns"])
    for f in data["functions"]:
        for ln, _code, hits, values in f["lines"]:
            if len(hits) != ranks or len(values) != ranks:
                raise ValueError(
                    f"{where}: line {ln} of {f['qualname']}: {len(hits)} hits and "
                    f"{len(values)} values for {ranks} ranks"
                )
            if any(v is not None and len(v) != width for v in values):
                raise ValueError(
                    f"{where}: line {ln} of {f['qualname']}: values for other than "
                    f"{width} columns"
                )


MERGED_LINE_PROFILE = Obj(
    "merged_line_profile",
    {
        "columns": TEXTS,
        "ranks": List(RANK),
        "world_size": WORLD,
        "functions": List(
            Obj(
                "merged_line_profile function {i}",
                {
                    "qualname": TEXT,
                    "filename": TEXT,
                    "lines": List(
                        Tuple(
                            "[line, code, hits per rank, values per rank]",
                            LINE,
                            TEXT,
                            List(Opt(BYTES)),
                            List(Opt(List(SIGNED))),
                        )
                    ),
                },
            )
        ),
        "notices": TEXTS,
    },
    rules=(_unique_ranks, _one_entry_per_rank),
)

# -- tensor reports ------------------------------------------------------------------------------

TENSOR_REPORT = Obj(
    "tensor report",
    {
        "verbose": Bool(),
        "sections": List(
            Obj(
                "tensor report section {i} ({device})",
                {
                    "device": TEXT,
                    "total_numel": BYTES,
                    "total_bytes": BYTES,
                    "total_storage_bytes": BYTES,
                    "omitted_rows": BYTES,
                    "omitted_bytes": BYTES,
                    "cuda": Opt(
                        Obj(
                            "{parent}, cuda",
                            {
                                "allocated": BYTES,
                                "requested": Opt(BYTES),
                                "reserved": Opt(BYTES),
                                "driver_used": Opt(BYTES),
                                "driver_total": Opt(BYTES),
                            },
                        )
                    ),
                    "rows": List(
                        Obj(
                            "{parent}, row {i}",
                            {
                                "name": TEXT,
                                "device": TEXT,
                                "shape": Opt(List(SIGNED)),
                                "shape_text": TEXT,
                                "dtype": TEXT,
                                "numel": BYTES,
                                "bytes": BYTES,
                                "storage_bytes": BYTES,
                                "shared_with": Opt(TEXT),
                            },
                        )
                    ),
                },
            )
        ),
        "incomplete": Opt(TEXT),
        "walk": Obj(
            "tensor report walk",
            {"strategy": TEXT, "tensors": BYTES, "walk_seconds": SECONDS, "facts_seconds": SECONDS},
        ),
    },
)


def _one_size_per_rank(data: dict[str, Any], where: str) -> None:
    ranks = len(data["ranks"])
    for i, row in enumerate(data["rows"]):
        if len(row["bytes"]) != ranks:
            raise ValueError(f"{where} row {i}: {len(row['bytes'])} sizes for {ranks} ranks")
    for device, sizes in data["totals"].items():
        if len(sizes) != ranks:
            raise ValueError(f"{where} totals {device}: {len(sizes)} sizes for {ranks} ranks")


MERGED_TENSOR_REPORT = Obj(
    "merged_tensor_report",
    {
        "ranks": List(RANK),
        "world_size": WORLD,
        "rows": List(
            Obj(
                "merged_tensor_report row {i}",
                {
                    "name": TEXT,
                    "device": TEXT,
                    "shape": Either(List(SIGNED), TEXT),
                    "dtype": TEXT,
                    "bytes": List(BYTES),
                },
            )
        ),
        "totals": Map(List(BYTES)),
    },
    rules=(_unique_ranks, _one_size_per_rank),
)

# -- the tracker, the estimate, a test's memory -----------------------------------------------

TRACKER = Obj(
    "tracker",
    {
        "rows": List(
            Obj(
                "tracker row {i}",
                {
                    "sign": OneOf("+", "-"),
                    "count": BYTES,
                    "shape": TEXT,
                    "dtype": TEXT,
                    "bytes": BYTES,
                    "type": TEXT,
                    "names": TEXTS,
                    "line": TEXT,
                },
                # files saved before the storage's own bytes were kept lack it
                optional={"storage_bytes": BYTES},
            )
        ),
        "total_bytes": BYTES,
        "allocated_bytes": BYTES,
        "tensors": BYTES,
        "where": TEXT,
        "strategy": TEXT,
        "incomplete": Opt(TEXT),
        "seconds": Map(SECONDS),
        "detail": Bool(),
        "stamp": Opt(TEXT),
    },
    optional={"total_storage_bytes": BYTES},
)


TEST_MEMORY = Obj(
    "test_memory",
    {
        "nodeid": TEXT,
        "outcome": TEXT,
        "measurements": List(
            Obj(
                "test_memory measurement {i}",
                {
                    "device": TEXT,
                    "peak_bytes": SIGNED,
                    "start_bytes": SIGNED,
                    "limit_bytes": Opt(SIGNED),
                },
                optional={
                    "rows": List(
                        Obj(
                            "{parent}, row {i}",
                            {"location": TEXT, "bytes": SIGNED, "count": SIGNED},
                        )
                    ),
                    "notices": TEXTS,
                },
            )
        ),
    },
)

# -- the trace -----------------------------------------------------------------------------------


def _stacks_name_frames(data: dict[str, Any], where: str) -> None:
    frames = len(data["frames"])
    for s, indices in enumerate(data["stacks"]):
        if indices and max(indices) >= frames:
            raise ValueError(f"{where}: stack {s} must list frame indices (0 to {frames - 1})")


TRACE = Obj(
    "trace",
    {
        "source": OneOf("cuda", "cpu"),
        "exclude": TEXTS,
        "frames": List(AnyObject(), what="a list of frame objects"),
        "stacks": List(List(Int(0, U32_MAX))),
        "snapshot": AnyObject(),  # torch's schema: the trace reader checks it
    },
    optional={"paths": OneOf("short", "full")},  # files before paths= read as short
    rules=(_stacks_name_frames,),
)

#: kind -> the schema of its ``data``.
SCHEMAS: dict[str, Obj] = {
    "line_profile": LINE_PROFILE,
    "merged_line_profile": MERGED_LINE_PROFILE,
    "tensor_report": TENSOR_REPORT,
    "merged_tensor_report": MERGED_TENSOR_REPORT,
    "tracker": TRACKER,
    "test_memory": TEST_MEMORY,
    "trace": TRACE,
}


def check(kind: str, data: Any, meta: Any) -> None:
    """A ValueError naming the first field of ``data`` or ``meta`` that is not what a
    ``kind`` result holds (its type, its range, its agreement with the other fields)."""
    META.check_object(meta, "meta")
    if kind in SCHEMAS:  # a kind whose data Rust reads is checked there (its serde derive)
        SCHEMAS[kind].check_object(data, SCHEMAS[kind].label("", kind))
