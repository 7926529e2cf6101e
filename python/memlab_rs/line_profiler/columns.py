"""The columns of a line report: which ones a report shows by default, and the check that
turns a wrong column name into a clear error before anything runs.

Which columns a memory source has, and what an unknown name is told (the closest valid name
and every valid one), is answered by the Rust core, once (``_core.line_profiler``: its
catalogue follows the keys ``torch.cuda.memory_stats()`` documents, built without asking
torch, which would initialise CUDA; the CPU source's is that source's own layout). Here:
what Python must check before a value reaches Rust, that ``columns`` is a list of names.

>>> check_columns("active_bytes.all.peak", "cpu")
('active_bytes.all.peak',)
>>> check_columns(["bogus.all.peak"], "cuda:0")
Traceback (most recent call last):
...
ValueError: unknown column 'bogus.all.peak' for the CUDA source...
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from memlab_rs import _core

#: The columns a report shows unless asked for others (pytorch_memlab's).
DEFAULT_COLUMNS: tuple[str, ...] = tuple(_core.line_profiler.DEFAULT_COLUMNS)


def column_names(columns: Any, parameter: str = "columns") -> tuple[str, ...]:
    """``columns`` as a tuple of names (one name is a list of one); a TypeError naming
    ``parameter`` when it is not a list of strings.

    >>> column_names("active_bytes.all.peak")
    ('active_bytes.all.peak',)
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
    return columns


def catalogue(device: str) -> tuple[str, ...]:
    """The columns the source of ``device`` (``"cpu"`` or ``"cuda:N"``) can have.

    >>> catalogue("cpu")[:2]
    ('allocated_bytes.all.current', 'allocated_bytes.all.peak')
    """
    return tuple(_core.line_profiler.catalogue(device))


def check_columns(
    columns: Any, device: str, known: Sequence[str] = (), parameter: str = "columns"
) -> tuple[str, ...]:
    """``columns`` as a tuple of names, each checked against what the source of ``device``
    has: ``known`` (the names it reported) when it has reported some, else its catalogue.
    A TypeError or ValueError that lists the valid ones otherwise."""
    names = column_names(columns, parameter)
    _core.line_profiler.check_columns(list(names), device, list(known))
    return names
