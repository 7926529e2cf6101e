"""The code object a profiler watches for what the user passed: a function, a method, an
``nn.Module`` (its ``forward``), a decorated function (the one it wraps); and
pytorch_memlab's warning for what has none.

Only the code object is kept, never the function: a profiled closure's captured values die
with the function.

>>> def step(): ...
>>> code, name = code_of(step)
>>> code is step.__code__, name
(True, 'step')
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

import torch


def code_of(func: Any) -> tuple[types.CodeType, str] | None:
    """The code object to watch for ``func`` and its qualname, or None if it has none."""
    if isinstance(func, types.CodeType):
        return func, getattr(func, "co_qualname", func.co_name)
    if isinstance(func, (staticmethod, classmethod)):
        func = func.__func__
    if isinstance(func, torch.nn.Module):
        func = type(func).forward
    if inspect.ismethod(func):
        func = func.__func__
    try:
        func = inspect.unwrap(func)
    except ValueError:  # a cycle of __wrapped__
        return None
    code = getattr(func, "__code__", None)
    if not isinstance(code, types.CodeType):
        return None
    return code, getattr(func, "__qualname__", code.co_name)


def no_code_warning(func: Any) -> str:
    """pytorch_memlab's warning for an object without a code object, and what to pass.

    >>> no_code_warning(len).split("; ")[1]
    'it is not profiled (pass a Python function, method or nn.Module)'
    """
    hint = "pass a Python function, method or nn.Module"
    if isinstance(func, property):
        hint = "pass the property's getter, e.g. Cls.prop.fget"
    elif isinstance(func, functools.partial):
        hint = "pass the function it calls, partial.func"
    return f"Could not extract a code object for the object {func!r}; it is not profiled ({hint})"
