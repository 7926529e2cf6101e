"""Checks of the public API's arguments, in one form: ``<name> must be <what>, got <value>``.

A value of the wrong type is a TypeError, one of the right type out of range a ValueError,
both raised before anything reaches Rust or torch, so that a caller never sees PyO3's
``OverflowError: can't convert negative int to unsigned`` or an ``AttributeError`` from
deep inside. Integer-like values (``numpy.int64``) count as ints, bools never do.

>>> count(3, "top")
3
>>> count(-1, "top")
Traceback (most recent call last):
...
ValueError: top must be an int >= 0, got -1
"""

from __future__ import annotations

import math
import operator
import os
import reprlib
from collections.abc import Callable, Iterable
from typing import Any

from ._interrupts import reraise_interrupt

#: The largest count the core takes (its counts are 64-bit); what is larger is an error,
#: not an OverflowError.
MAX_COUNT = 2**63 - 1

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60


def shown(value: Any) -> str:
    """``repr(value)`` cut to a readable length, for error messages; an int of hundreds of
    digits by its size.

    >>> shown(2**200), len(shown("x" * 1000))
    ('an int of 201 bits', 60)
    """
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**40:
        sign = "a negative " if value < 0 else "an "
        return f"{sign}int of {value.bit_length()} bits"
    try:
        return _repr.repr(value)
    except Exception as error:  # a broken __repr__ of the caller's object
        reraise_interrupt(error)
        return f"<{type(value).__name__} object>"


def _is_index(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def count(
    value: Any,
    name: str,
    *,
    minimum: int = 0,
    maximum: int = MAX_COUNT,
    what: str = "an int",
) -> int:
    """``value`` as an int from ``minimum`` to ``maximum``; a TypeError (not an int) or a
    ValueError (out of range) naming ``name`` otherwise."""
    bounds = f">= {minimum}" if maximum == MAX_COUNT else f"from {minimum} to {maximum}"
    expected = f"{what} {bounds}"
    if not _is_index(value):
        raise TypeError(f"{name} must be {expected}, got {shown(value)} ({type(value).__name__})")
    number = operator.index(value)
    if number < minimum or number > maximum:
        if number > maximum == MAX_COUNT:
            expected += f" and at most 2**63 - 1 ({MAX_COUNT})"
        raise ValueError(f"{name} must be {expected}, got {shown(number)}")
    return number


def size(value: Any, name: str) -> int:
    """``value`` as bytes, parsed as every size memlab_rs takes (``memlab_rs.parse_size``:
    an int, or ``"512 MB"``, ``"1.5GiB"``, ``"16M"``); the parser's error with ``name``
    in front otherwise.

    >>> size("2 MiB", "budget")
    2097152
    """
    from ._core import parse_size

    try:
        return parse_size(value)
    except TypeError as error:
        raise TypeError(f"{name}: {error}") from None
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None


def number(
    value: Any,
    name: str,
    *,
    minimum: float = 0.0,
    maximum: float = math.inf,
    what: str = "a number",
) -> float:
    """``value`` as a finite float from ``minimum`` to ``maximum`` (an int or a float, not
    a bool); a TypeError or ValueError naming ``name`` otherwise.

    >>> number(float("nan"), "budget")
    Traceback (most recent call last):
    ...
    ValueError: budget must be a number >= 0, finite, got nan
    """
    bounds = f">= {minimum:g}" if maximum == math.inf else f"from {minimum:g} to {maximum:g}"
    expected = f"{what} {bounds}, finite"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be {expected}, got {shown(value)} ({type(value).__name__})")
    try:
        as_float = float(value)
    except OverflowError:  # an int beyond any float
        as_float = math.inf
    if not (math.isfinite(as_float) and minimum <= as_float <= maximum):
        raise ValueError(f"{name} must be {expected}, got {shown(value)}")
    return as_float


def choice(value: Any, name: str, choices: Iterable[str]) -> str:
    """``value`` if it is one of ``choices``; a ValueError listing them otherwise."""
    options = list(choices)
    if not isinstance(value, str) or value not in options:
        listed = ", ".join(repr(c) for c in options[:-1]) + f" or {options[-1]!r}"
        error = ValueError if isinstance(value, str) else TypeError
        raise error(f"{name} must be {listed}, got {shown(value)}")
    return value


def path(value: Any, name: str) -> str:
    """``value`` as a file path (a str, bytes or an ``os.PathLike``); a TypeError naming
    ``name`` otherwise. An int is refused: ``open(1)`` would write to, then close, standard
    output."""
    if isinstance(value, (str, bytes, os.PathLike)):
        found = os.fspath(value)
        if isinstance(found, bytes):
            found = os.fsdecode(found)
        if not found:
            raise ValueError(f"{name} must be a file path, got an empty one")
        if "\0" in found:
            raise ValueError(f"{name} must be a file path, got {shown(found)}: it holds a NUL")
        return found
    raise TypeError(
        f"{name} must be a file path (a str or os.PathLike), got {shown(value)} "
        f"({type(value).__name__})"
    )


def optional_path(value: Any, name: str) -> str | None:
    """``path(value, name)``, or None for None."""
    return None if value is None else path(value, name)


def stream(value: Any, name: str) -> Any:
    """``value`` if it has a ``write`` method (a text stream); a TypeError naming ``name``
    otherwise (a file name is not a stream: open it, or use the method that takes a path)."""
    if callable(getattr(value, "write", None)):
        return value
    hint = "; open the file and pass it" if isinstance(value, (str, os.PathLike)) else ""
    raise TypeError(
        f"{name} must be a text stream with a write() method (sys.stdout, an open file, "
        f"io.StringIO), got {shown(value)} ({type(value).__name__}){hint}"
    )


def function(value: Any, name: str, what: str = "a function") -> Callable[..., Any]:
    """``value`` if it is callable; a TypeError naming ``name`` otherwise."""
    if not callable(value):
        raise TypeError(f"{name} must be {what}, got {shown(value)} ({type(value).__name__})")
    return value
