"""The CPU memory source's torch-facing side.

CPU memory is counted at torch's CPU allocator by the core (``src/sources/cpu``: its GOT
slots for ``posix_memalign`` and ``free`` in ``libc10.so``, and why that mechanism). This
module gives the core what only Python knows:

- where torch's ``libc10.so`` is;
- a probe: a tensor of a known size that must reach the hook, checked before the hook is
  trusted;
- the baseline: the storages of every CPU tensor Python can reach when tracking starts
  (one gc walk at ``enable()``, never per call), each adopted by its address and size, with a
  weak reference that uncounts it when it dies if its memory never comes back through the
  hook (storages the CPU allocator did not make: numpy's, ``mmap``-loaded ones);
- the dispatch-mode fallback (``cpu_dispatch``), used where the hook is impossible.
"""

from __future__ import annotations

import os
import weakref
from functools import partial
from typing import Any

import torch

from .. import _core
from . import cpu_dispatch

# Weak references to the storages adopted by the latest baseline (replaced at each start:
# dropping the old ones cancels their callbacks).
_adopted: list[weakref.ref] = []


def library() -> str | None:
    """The ``libc10.so`` torch loaded, or None when there is none to hook."""
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
    return path if os.path.exists(path) else None


def probe() -> bool:
    """Allocate and free one CPU tensor of a known size: True when the hook saw both."""
    nbytes = _core._CPU_PROBE_BYTES
    tensor = torch.empty(nbytes, dtype=torch.uint8)
    address = tensor.data_ptr()
    seen = _core._cpu_table_has(address, nbytes)
    del tensor
    return seen and not _core._cpu_table_has(address, nbytes)


def baseline() -> tuple[list[tuple[int, int]], list[Any]]:
    """(address, bytes) of each CPU storage alive now, and the storages (the core holds them
    until they are in its table, so none is freed in between)."""
    global _adopted
    pairs: list[tuple[int, int]] = []
    storages: list[Any] = []
    refs: list[weakref.ref] = []
    seen: set[int] = set()
    tensors = _core.tracked_tensors()[0]
    for tensor in tensors:
        try:
            if tensor.device.type != "cpu" or tensor.is_pinned():
                continue  # pinned memory comes from the CUDA host allocator
            storage = tensor.untyped_storage()
            if storage.device.type != "cpu":
                continue  # a fake tensor (torch.compile's, the estimate's): no memory
            address = storage.data_ptr()
            nbytes = storage.nbytes()
            if nbytes == 0 or address in seen or storage.is_shared():
                continue  # shared memory is not the CPU allocator's
        except (RuntimeError, NotImplementedError, TypeError):
            continue  # sparse or a wrapper subclass: no storage of its own
        seen.add(address)
        pairs.append((address, nbytes))
        storages.append(storage)
        refs.append(weakref.ref(storage, partial(_gone, address, nbytes)))
    _adopted = refs
    return pairs, storages


def _gone(address: int, nbytes: int, _ref: weakref.ref) -> None:
    _core._cpu_adopted_gone(address, nbytes)


def forget() -> None:
    """A session of the CPU source starts (the hook's or the fallback's): drop what an
    earlier one left here, the adopted storages' weak references and the fallback's live
    table, so that no callback of theirs reaches the new session's counters."""
    global _adopted
    _adopted = []
    cpu_dispatch.forget()


# Looked up at each call, so that a test can stand in for a torch whose allocator the hook
# cannot see.
_core._set_cpu_glue(library(), lambda: probe(), lambda: baseline(), lambda: forget())
