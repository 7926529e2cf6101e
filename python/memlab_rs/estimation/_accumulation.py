"""Autograd's gradient accumulation as a real step does it: in place where it can.

When two gradients reach the same input, the engine adds them (``InputBuffer::accumulate``,
torch/csrc/autograd/input_buffer.cpp): into the older one in place when the buffer holds
its only reference and it is dense, else into a new tensor (the newer one is a candidate
only for sparse gradients, which the estimate does not model). Under any
TorchDispatchMode (the recorder is one) ``isTensorSubclassLike`` is true for every tensor,
so on fake tensors the engine always makes a new tensor: an allocation and two frees where
a real step frees the newer gradient and allocates nothing. That seldom moves the peak
allocated, but it changes which blocks are free when, and so the segments the caching
allocator takes (on an H200 it was the difference between ResNet-18's estimated and real
reserved peaks in bf16, under autocast and with checkpointing).

The recorder asks ``in_place`` for each op; it answers only between a node's return and
the next node's start (hooks on every node of the graph being differentiated), where the
engine's accumulation is the only ``aten.add.Tensor``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from .. import _torch
from ._cuda_blas import non_overlapping_and_dense

_ADD = torch.ops.aten.add.Tensor
_ADD_ = torch.ops.aten.add_.Tensor


class Accumulation:
    """Tells the engine's accumulations apart from the nodes' own adds, and says where the
    real engine would add in place."""

    def __init__(self) -> None:
        self.between = False  # a node has returned and the next has not started
        self._handles: list[Any] = []
        _sole_counts()  # calibrated before the fake step's modes are on

    @contextlib.contextmanager
    def watching(self, root: torch.Tensor) -> Iterator[None]:
        """Every node of the graph behind `root` (the loss) hooked once for one backward."""
        for node in _torch.autograd_nodes([root.grad_fn]):
            self._handles.append(node.register_prehook(self._starts))
            if node.next_functions:  # AccumulateGrad has none, and nothing to accumulate
                self._handles.append(node.register_hook(self._returned))
        node = None  # nor is the last node's object held through the backward
        try:
            yield
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles.clear()
            self.between = False

    def _starts(self, _grad_outputs: Any) -> None:
        self.between = False

    def _returned(self, _grad_inputs: Any, _grad_outputs: Any) -> None:
        self.between = True

    def in_place(self, func: Any, args: tuple, kwargs: dict) -> tuple[Any, tuple] | None:
        """The op and arguments of the real engine's in-place accumulation for this
        ``old + new``, or None where it is not one or the real engine adds out of place."""
        if not self.between or func is not _ADD or kwargs or len(args) != 2:
            return None
        old, new = args
        if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)) or old is new:
            return None
        if old.shape != new.shape or old.dtype != new.dtype:
            return None
        return (_ADD_, (old, new)) if _sole_and_dense(old) else None


def _sole_and_dense(t: torch.Tensor) -> bool:
    """``can_accumulate_inplace``: dense, and the engine holds the only reference to it
    and its storage (the counts as the recorder sees them, calibrated once)."""
    counts = (t._use_count(), torch._C._storage_Use_Count(t.untyped_storage()._cdata))
    dense = non_overlapping_and_dense(list(t.shape), list(t.stride()))
    return counts == _sole_counts() and dense


@functools.cache
def _sole_counts() -> tuple[int, int]:
    """The (tensor, storage) use counts a dispatch mode sees for a gradient only the
    engine's input buffer holds: two matmul gradients of one input, accumulated."""
    seen: list[tuple[int, int]] = []

    class _Counts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is _ADD and torch._C._current_autograd_node() is not None:
                t = args[0]
                storage = torch._C._storage_Use_Count(t.untyped_storage()._cdata)
                seen.append((t._use_count(), storage))
            return func(*args, **(kwargs or {}))

    # On plain CPU tensors, whatever modes the caller has on (the fake step's, a user's).
    with _disable_current_modes(), torch.enable_grad():
        x = torch.ones(2, 2, requires_grad=True)
        w = torch.ones(2, 2)
        h = x * 1.0
        out = ((h @ w) * (h @ w.t())).sum()
        with _Counts():
            # Straight to the engine, as torch.autograd.backward calls it: not through the
            # public function, which tools wrap to count a user's backward passes (the
            # memory monitor does).
            torch.autograd.Variable._execution_engine.run_backward(
                (out,), (torch.ones_like(out),), False, False, (), True, True
            )
    return seen[0] if seen else (-1, -1)
