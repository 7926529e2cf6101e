"""The schema of every saved result kind: the one place a loaded document is checked, field
by field, before any result class sees it.

A result file may come from anyone. Each kind's class used to trust its ``data`` (or check
some fields and not others), so a wrong type at one field surfaced anywhere later: a
``TypeError`` in a renderer, an ``OverflowError`` where a number reached Rust, an
``AttributeError`` in a merge. Here every field of every kind has a type and a range (the
range its renderer takes: byte counts fit in an i64, line numbers in a u32), and the few
rules between fields (one value per column, one entry per rank) are stated beside them.
``check(kind, data, meta)`` raises a ValueError naming the field, what it must be and what
it is; the kind's ``from_data`` then only builds. The redesign turns these into serde-typed
Rust structs, room by room: a converted kind's schema is its derive (``test_memory``'s, the
line profiler's ``line_profile`` and ``merged_line_profile``), checked when its class takes
the data (``results.Result``), and it leaves this file.

What is left to others: the syntax, nesting and numbers of the JSON text
(``_core.check_result_json``, before parsing), and the kinds whose data Rust reads: their
schema is their serde derive (``src/<room>/result.rs``), checked by the room's
``_core.<room>.validate`` when the result is built. A trace's fields are checked so
(``_core.trace.validate``), its snapshot (torch's schema) by the trace reader that analyses
it (``src/trace/py/load.rs``), and what only the analysis can tell (a ``source`` that
disagrees with the snapshot) by ``TraceResult.from_data``.

>>> check("test_memory", {"nodeid": "t"}, {})
Traceback (most recent call last):
...
ValueError: test_memory: no "outcome" field
"""

from __future__ import annotations

from typing import Any

from ._json_schema import (
    I64_MIN,
    RANK_MAX,
    Float,
    Int,
    List,
    Obj,
    Opt,
    Str,
    shown,
)

# -- the types fields share ---------------------------------------------------------------------

BYTES = Int(0)  # byte counts and counts: the renderers take u64 or i64
SIGNED = Int(I64_MIN)  # a change: i64
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

#: kind -> the schema of its ``data``.
SCHEMAS: dict[str, Obj] = {
    "test_memory": TEST_MEMORY,
}


def check(kind: str, data: Any, meta: Any) -> None:
    """A ValueError naming the first field of ``data`` or ``meta`` that is not what a
    ``kind`` result holds (its type, its range, its agreement with the other fields)."""
    META.check_object(meta, "meta")
    if kind in SCHEMAS:  # a kind whose data Rust reads is checked there (its serde derive)
        SCHEMAS[kind].check_object(data, SCHEMAS[kind].label("", kind))
