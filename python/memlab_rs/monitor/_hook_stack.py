"""The saved-tensor hook stack of each thread, as the monitor uses it: torch's private
push/pop/top of the default hooks (what ``torch.autograd.graph.saved_tensors_hooks`` does
on entry and exit), and the pairs of stopped monitors left on a stack until they surface."""

from __future__ import annotations

import threading
from typing import Any

import torch

_autograd = torch._C._autograd


# The pairs of stopped monitors left on a thread's stack (a pair was over them, or the stop
# came from another thread), by (thread, pack): inert pass-throughs until they come to the
# top of that thread's stack, where the next push or pop of a monitor on that thread takes
# them off. Left there, a later monitor would chain one, and count nothing of what it holds.
_inert: dict[tuple[int, int], tuple[Any, Any]] = {}
_inert_lock = threading.Lock()


def left_inert(thread: int, pack: Any, unpack: Any) -> None:
    with _inert_lock:
        _inert[(thread, id(pack))] = (pack, unpack)


def pop_inert() -> None:
    """Pop the stopped monitors' pairs on top of this thread's stack."""
    thread = threading.get_ident()
    while True:
        pair_on_top = top()
        if pair_on_top is None:
            return
        with _inert_lock:
            pair = _inert.get((thread, id(pair_on_top[0])))
            if pair is None or pair[0] is not pair_on_top[0] or pair[1] is not pair_on_top[1]:
                return
            del _inert[(thread, id(pair_on_top[0]))]
        _autograd._pop_saved_tensors_default_hooks()


def top() -> tuple[Any, Any] | None:
    """The pair on top of this thread's stack, or None (none, or a torch too old to say)."""
    read = getattr(_autograd, "_top_saved_tensors_default_hooks", None)
    if read is None:  # older torch: cannot see an outer pair; documented limitation
        return None
    return read(False)


def push(pack: Any, unpack: Any) -> None:
    """Push a pair on this thread's stack (what ``saved_tensors_hooks`` does on entry)."""
    _autograd._push_saved_tensors_default_hooks(pack, unpack)


def pop() -> None:
    """Pop the pair on top of this thread's stack."""
    _autograd._pop_saved_tensors_default_hooks()
