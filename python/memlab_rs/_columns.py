"""The columns of a line report: every statistic a memory source can have, and the check
that turns a wrong column name into a clear error before anything runs.

The CUDA catalogue follows the key pattern that ``torch.cuda.memory_stats()`` documents,
built here because asking torch for its keys would initialise CUDA. It is a superset: a
torch version may lack a recent key (``num_oom_rejections``), which the report then names.
The CPU source counts tensor storages under the same names, in the one pool ``all``; its
list mirrors ``CPU_STATS`` in ``src/line_profiler/layout.rs`` (a test compares them).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from typing import Any

# <statistic>.<pool>.<field>
_CUDA_STATS = (
    "allocated_bytes",
    "active_bytes",
    "requested_bytes",
    "reserved_bytes",
    "inactive_split_bytes",
    "allocation",
    "active",
    "segment",
    "inactive_split",
)
_POOLS = ("all", "large_pool", "small_pool")
_FIELDS = ("current", "peak", "allocated", "freed")
# <statistic>.<field>, no pool
_OVERSIZE = ("oversize_allocations", "oversize_segments")
_SCALARS = (
    "num_alloc_retries",
    "num_ooms",
    "num_sync_all_streams",
    "num_device_alloc",
    "num_device_free",
    "num_oom_rejections",
    "max_split_size",
)
# reserved_bytes_by_private_pools.<MemPool id>.<pool>.<field>: one set per private pool
_PRIVATE_POOL = re.compile(
    r"reserved_bytes_by_private_pools\.[^.\s]+\.(all|large_pool|small_pool)\."
    r"(current|peak|allocated|freed)"
)
CPU_STATS = (
    "allocated_bytes",
    "active_bytes",
    "reserved_bytes",
    "requested_bytes",
    "allocation",
    "active",
    "segment",
)


def cuda_catalogue() -> tuple[str, ...]:
    """Every key ``torch.cuda.memory_stats()`` can have (private pools aside), sorted as
    torch sorts them.

    >>> "active_bytes.all.peak" in cuda_catalogue() and "num_ooms" in cuda_catalogue()
    True
    """
    names = [f"{s}.{p}.{f}" for s in _CUDA_STATS for p in _POOLS for f in _FIELDS]
    names += [f"{s}.{f}" for s in _OVERSIZE for f in _FIELDS]
    names += _SCALARS
    return tuple(sorted(names))


def cpu_catalogue() -> tuple[str, ...]:
    """The CPU source's columns, in the order it stores them.

    >>> cpu_catalogue()[:2]
    ('allocated_bytes.all.current', 'allocated_bytes.all.peak')
    """
    return tuple(f"{s}.all.{f}" for s in CPU_STATS for f in _FIELDS)


def catalogue(device: str) -> tuple[str, ...]:
    """The columns the source of ``device`` (``"cpu"`` or ``"cuda:N"``) can have."""
    return cpu_catalogue() if device == "cpu" else cuda_catalogue()


def check_columns(
    columns: Any, device: str, known: Sequence[str] = (), parameter: str = "columns"
) -> tuple[str, ...]:
    """``columns`` as a tuple of names, each checked against what the source of ``device``
    has: ``known`` (the names it reported) when it has reported some, else its catalogue.

    >>> check_columns("active_bytes.all.peak", "cpu")
    ('active_bytes.all.peak',)
    >>> check_columns(["bogus.all.peak"], "cuda:0")
    Traceback (most recent call last):
    ...
    ValueError: unknown column 'bogus.all.peak' for the CUDA source...
    """
    if isinstance(columns, str):
        columns = (columns,)
    if not isinstance(columns, Iterable):
        raise TypeError(
            f"{parameter} must be a list of column names (keys of torch.cuda.memory_stats()), "
            f"got {columns!r} ({type(columns).__name__})"
        )
    columns = tuple(columns)
    bad = [c for c in columns if not isinstance(c, str)]
    if bad:
        raise TypeError(f"{parameter} must be names of memory statistics (strings), got {bad!r}")
    valid = tuple(known) or catalogue(device)
    for column in columns:
        if column in valid or (device != "cpu" and not known and _PRIVATE_POOL.fullmatch(column)):
            continue
        raise ValueError(_unknown(column, device, valid))
    return columns


def _unknown(column: str, device: str, valid: Sequence[str]) -> str:
    source = "CPU" if device == "cpu" else "CUDA"
    if device == "cpu" and column in cuda_catalogue():
        why = (
            f"column {column!r} is a CUDA statistic that the CPU source does not have (it "
            "counts tensor storages, in the one pool 'all')"
        )
    else:
        why = f"unknown column {column!r} for the {source} source"
        close = difflib.get_close_matches(column, valid, n=1)
        if close:
            why += f" (did you mean {close[0]!r}?)"
    return (
        f"{why}. The columns are keys of torch.cuda.memory_stats(); this source has: "
        + ", ".join(valid)
    )


def check_saved_columns(columns: Any, saved: Sequence[str], device: Any) -> tuple[str, ...]:
    """``columns`` checked against the columns a saved line profile holds (``saved``): a
    TypeError or ValueError naming the problem and the columns it has otherwise.

    >>> check_saved_columns(["active_bytes.all.peak"], ["active_bytes.all.peak"], "cpu")
    ('active_bytes.all.peak',)
    """
    device = device if isinstance(device, str) else "cuda:0"
    checked = check_columns(columns, device, saved or ("",))
    return checked
