"""The CPU source's fallback: CPU tensor storages, counted as operators create them.

Used only where the allocator hook of ``src/sources/cpu`` is impossible (no ``libc10.so``
with a GOT to rewrite: another platform, a statically linked torch), or with
``MEMLAB_RS_CPU_SOURCE=dispatch``; every report made with it says so. Its limits follow from
how it works: while a profiled function runs on a thread
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
functions (tensors autograd saved before); storages an operator writes into without
creating (``out=``, ``resize_``); storages made outside dispatch (deserialisation, numpy
conversion); temporaries inside operators; and allocations on threads that do not carry the
dispatch mode (threads the profiled function starts, C++ threads). Each profiled call walks
every live tensor, and each operator costs several microseconds.

Where the counting mode lives, and why it never outlives profiling
------------------------------------------------------------------
torch keeps dispatch modes on a stack per thread, and only a thread can take a mode off its
own stack. The core tells this module when to act (``_core._set_cpu_tracking``):

- ``start_tracking(thread)``: the first profiled frame started on the calling thread. Any
  mode of ours still on this thread's stack (retired, see below) is taken off first, so
  modes of earlier ``enable()`` calls never stack up; then a fresh mode is pushed.
- ``stop_tracking()``: the last profiled frame on the calling thread ended, or profiling
  ended while this thread ran one (``disable()`` called here). Our modes come off this
  thread's stack at once, wherever they are in it: modes pushed above ours are put back in
  their order.
- ``retire_tracking(thread)``: profiling ended for another thread that is still inside a
  profiled frame (``disable()`` called elsewhere). Its mode stops counting at once (it
  becomes a pure pass-through) and that thread takes it off at its next safe point: its
  next start or stop, or when the thread ends. The last is a ``threading.local`` record
  whose finaliser runs on the thread itself while CPython clears its thread state, before
  the thread lets go of the interpreter for the last time.

Why the thread's end matters: a mode still on a thread's stack when the thread exits is
released by a C++ thread-local destructor that takes the GIL; if the interpreter is
shutting down at that moment the thread is killed inside the destructor and the process
aborts ("terminate called without an active exception"). Modes are pushed and popped with
torch's stack functions rather than ``with mode:``, because ``TorchDispatchMode.__enter__``
also sets module-level flags that are global to the process while the stack is per thread:
threads entering and leaving in turn would leave them set after profiling.

A forked child takes our modes off the forking thread (the only thread it has) and forgets
the live table (see ``_after_fork_in_child``).

A daemon thread that is still inside a profiled function when the interpreter exits keeps
its retired mode; torch frees it without the GIL once the interpreter is gone.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from functools import partial
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import _core

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

    def __init__(self) -> None:
        super().__init__()
        self.counting = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.counting:
            return out
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


class _ThreadRecord:
    """Our modes on one thread's dispatch stack; finalised on that thread when it ends."""

    __slots__ = ("modes", "__weakref__")

    def __init__(self) -> None:
        self.modes: list[StorageCounter] = []

    def __del__(self) -> None:
        if self.modes and not sys.is_finalizing():
            try:
                _take_off(self)
            except Exception:  # a finaliser must not raise
                pass


_local = threading.local()
# the core's thread key -> that thread's record (for retire_tracking from another thread)
_records: weakref.WeakValueDictionary[int, _ThreadRecord] = weakref.WeakValueDictionary()
# every mode alive (tests check that retired modes do not linger)
_all_modes: weakref.WeakSet[StorageCounter] = weakref.WeakSet()


def _record() -> _ThreadRecord:
    record = getattr(_local, "record", None)
    if record is None:
        record = _local.record = _ThreadRecord()
    return record


def _take_off(record: _ThreadRecord) -> None:
    """Take the record's modes off the calling thread's dispatch stack, wherever they are;
    the modes above them go back in their order. Modes not on this stack (another thread's,
    finalised in a forked child) are only forgotten."""
    mine = record.modes
    record.modes = []
    for mode in mine:
        mode.counting = False
    size = torch._C._len_torch_dispatch_stack()
    at = [i for i in range(size) if any(torch._C._get_dispatch_stack_at(i) is m for m in mine)]
    if not at:
        return
    # Our modes are user modes, above torch's infra modes: popping down to the lowest of
    # them pops user modes only.
    above = [torch._C._pop_torch_dispatch_stack(None) for _ in range(size - at[0])]
    for mode in reversed(above):
        if not any(mode is m for m in mine):
            torch._C._push_on_torch_dispatch_stack(mode)


def start_tracking(thread: int) -> None:
    """Adopt live storages and push a counting mode on the calling thread (the core calls
    this when the first profiled frame starts on a thread; ``thread`` is its key)."""
    record = _record()
    _take_off(record)  # a mode retired by an earlier disable()
    _records[thread] = record
    _adopt_existing()
    mode = StorageCounter()
    torch._C._push_on_torch_dispatch_stack(mode)
    record.modes.append(mode)
    _all_modes.add(mode)


def stop_tracking() -> None:
    """Take the calling thread's counting modes off its dispatch stack."""
    record = getattr(_local, "record", None)
    if record is not None:
        _take_off(record)


def retire_tracking(thread: int) -> None:
    """Stop the counting of another thread's modes now; that thread takes them off later."""
    record = _records.get(thread)
    if record is not None:
        for mode in record.modes:
            mode.counting = False


def _retired_modes_alive() -> int:
    """How many modes that no longer count still exist (on some thread's stack)."""
    return sum(1 for mode in list(_all_modes) if not mode.counting)


def _after_fork_in_child() -> None:
    """A forked child has only the forking thread: take our modes off its stack, stop the
    others (their threads do not exist here), and forget the live table: the next profiled
    start adopts what this process holds."""
    record = getattr(_local, "record", None)
    if record is not None:
        _take_off(record)
    for other in list(_records.values()):
        for mode in other.modes:
            mode.counting = False
    _records.clear()
    for _, nbytes in list(_live.values()):
        _core._cpu_freed(nbytes)
    _live.clear()


def live() -> tuple[int, int]:
    """(bytes, storages) counted alive right now."""
    return _core._cpu_live()


def forget() -> None:
    """Forget the live table without uncounting it: a new session of the CPU source starts
    (the core zeroes the counters; its weak references are dropped, so their callbacks never
    run, and the core ignores ``_cpu_freed`` outside a session of this fallback)."""
    _live.clear()


_core._set_cpu_tracking(start_tracking, stop_tracking, retire_tracking)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
