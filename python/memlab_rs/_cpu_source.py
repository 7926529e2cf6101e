"""The CPU memory source: live CPU tensor storages, counted as they are created and freed.

torch's CPU allocator keeps no statistics, so while a profiled function runs on a thread
a ``TorchDispatchMode`` sees every operator there, counts each new CPU storage its outputs
own (those the operator's schema does not mark as aliasing an input), and holds a weak
reference to the storage object, which dies exactly when the storage is freed (torch keeps
a storage's Python object alive as long as the storage lives). When the first profiled
function starts on a thread, the storages of every CPU tensor Python can reach (found by
the reporter's gc walk) are adopted the same way, so current and peak values include the
model, its grads and the optimizer state. The counts live in the Rust core and take the
names of ``torch.cuda.memory_stats()`` (``allocated_bytes.all.current``,
``active_bytes.all.peak``).

What it cannot see: storages no Python object reaches that were created outside profiled
functions (tensors autograd saved before), memory that is not a tensor storage, and
allocations on C++ threads that do not carry the dispatch mode.
"""

from __future__ import annotations

import threading
import weakref
from functools import partial
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from . import _core

# storage address -> (weak reference whose callback uncounts it, counted bytes)
_live: dict[int, tuple[weakref.ref, int]] = {}
# operator -> indexes of its outputs that are new storages (cached: schemas do not change)
_fresh_outputs: dict[Any, tuple[int, ...]] = {}
# operators whose output aliases an input that was itself just created outside dispatch
_LIFTED = ("lift_fresh",)


def _fresh(func: Any) -> tuple[int, ...]:
    found = _fresh_outputs.get(func)
    if found is None:
        try:
            returns = func._schema.returns
            found = tuple(i for i, r in enumerate(returns) if r.alias_info is None)
            if func._schema.name.split("::")[-1] in _LIFTED:
                found = tuple(range(len(returns)))
        except AttributeError:
            found = ()
        _fresh_outputs[func] = found
    return found


def _gone(key: int, nbytes: int, _ref: weakref.ref) -> None:
    if _live.pop(key, None) is not None:
        _core._cpu_freed(nbytes)


def _count(tensor: Any, made_here: bool = True) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
        return
    try:
        storage = tensor.untyped_storage()
        key = storage._cdata
        nbytes = storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        return  # sparse or a wrapper subclass: its parts are counted as they are made
    if key in _live or nbytes == 0:
        return
    _live[key] = (weakref.ref(storage, partial(_gone, key, nbytes)), nbytes)
    if made_here:
        _core._cpu_allocated(nbytes)
    else:
        _core._cpu_adopted(nbytes)


def _adopt_existing() -> None:
    """Count the storages of every CPU tensor Python can reach right now."""
    tensors = _core.tracked_tensors()[0]
    for tensor in tensors:
        _count(tensor, made_here=False)


class StorageCounter(TorchDispatchMode):
    """Counts the CPU storages the operators on this thread create (see the module doc)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        fresh = _fresh(func)
        if fresh:
            if isinstance(out, torch.Tensor):
                _count(out)
            elif isinstance(out, (tuple, list)):
                for i in fresh:
                    if i < len(out):
                        item = out[i]
                        if isinstance(item, (tuple, list)):
                            for t in item:
                                _count(t)
                        else:
                            _count(item)
        return out


_modes = threading.local()


def start_tracking() -> None:
    """Adopt live storages and push a counting mode on the calling thread (the core calls
    this when the first profiled frame starts on a thread)."""
    _adopt_existing()
    mode = StorageCounter()
    mode.__enter__()
    stack = getattr(_modes, "stack", None)
    if stack is None:
        stack = _modes.stack = []
    stack.append(mode)


def stop_tracking() -> None:
    """Pop the calling thread's counting mode, if it is still the innermost one."""
    stack = getattr(_modes, "stack", None)
    if not stack:
        return
    mode = stack[-1]
    if _get_current_dispatch_mode() is mode:
        stack.pop()
        mode.__exit__(None, None, None)


def live() -> tuple[int, int]:
    """(bytes, storages) counted alive right now."""
    return _core._cpu_live()


_core._set_cpu_tracking(start_tracking, stop_tracking)
