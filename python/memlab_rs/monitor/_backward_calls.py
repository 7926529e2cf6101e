"""Backward boundaries for the training monitor: ``torch.autograd.backward`` and
``torch.autograd.grad`` wrapped, so each listener hears when a backward pass starts and
when it has returned.

Why wrap them rather than watch autograd: the first unpack of a saved tensor (what a
saved-tensor hook sees) needs a hook pair installed during forward, and torch's hook
mechanism costs several microseconds per saved tensor (10 to 15% of a CPU-bound step). The
wrapper costs one Python call per backward. ``Tensor.backward`` looks ``torch.autograd.backward``
up at each call, as do accelerate, Lightning, DeepSpeed and ``GradScaler``; code that bound
the original function before the monitor started (``from torch.autograd import backward``)
is not seen (docs/guide.md).

A backward started inside another (reentrant checkpointing runs one in its backward) is
part of the outer one: a listener already in backward ignores it. A backward that
``torch.compile`` traces (AOTAutograd calls ``torch.autograd.grad`` on fake and functional
tensors while it compiles a forward) allocates nothing and is not passed on. The wrappers are
installed while any listener is registered; when the last one leaves, the originals are put
back, unless something else wrapped them since, in which case ours stay, passing through.
Listeners are held weakly: a monitor dropped without ``stop()`` is not kept alive by this.

Each listener hears the backward's roots: the autograd node of each tensor it starts from
(None for a tensor without one), where a listener can put hooks for that backward.

>>> import torch
>>> from memlab_rs.monitor import _backward_calls
>>> class Printer:
...     def backward_start(self, roots):
...         print("start", [type(r).__name__ for r in roots])
...         return True
...     def backward_end(self):
...         print("end")
>>> p = Printer()
>>> _backward_calls.add(p)
>>> torch.ones(2, requires_grad=True).sum().backward()
start ['SumBackward0']
end
>>> _backward_calls.remove(p)
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from typing import Any, Callable, Protocol

import torch


class Listener(Protocol):
    def backward_start(self, roots: list[Any]) -> bool:
        """A backward pass starts from ``roots`` (autograd nodes, None for a tensor without
        one); True if this listener treats it as a boundary (then ``backward_end`` is called
        when it returns)."""

    def backward_end(self) -> None:
        """The backward pass that ``backward_start`` accepted has returned."""


_lock = threading.Lock()
_listeners: list[weakref.ref[Listener]] = []
_originals: dict[str, Callable[..., Any]] = {}
_wrappers: dict[str, Callable[..., Any]] = {}


def _wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _lock:
            listeners = [listener() for listener in _listeners]
        start = args[0] if args else kwargs.get(_FIRST[name])
        if _traced(start):
            return original(*args, **kwargs)
        roots = _roots(start)
        started = [x for x in listeners if x is not None and x.backward_start(roots)]
        try:
            return original(*args, **kwargs)
        finally:
            for listener in started:
                listener.backward_end()

    wrapper.__memlab_rs_wrapper__ = name  # type: ignore[attr-defined]
    return wrapper


# The parameter a backward starts from: torch.autograd.backward's and grad's first.
_FIRST = {"backward": "tensors", "grad": "outputs"}


def _roots(start: Any) -> list[Any]:
    """The autograd node of each tensor (or ``GradientEdge``) a backward starts from."""
    items = start if isinstance(start, (list, tuple)) else [start]
    return [
        item.grad_fn if isinstance(item, torch.Tensor) else getattr(item, "node", None)
        for item in items
    ]


_is_compiling: Callable[[], bool] = getattr(
    getattr(torch, "compiler", None), "is_compiling", lambda: False
)


def _traced(start: Any) -> bool:
    """Whether this backward is torch.compile tracing one: while compiling (newer torch
    says so), or from a fake or functional tensor (older torch does not say)."""
    if _is_compiling():
        return True
    items = start if isinstance(start, (list, tuple)) else [start]
    kinds = [
        getattr(sys.modules.get(module), name, None)
        for module, name in (
            ("torch._subclasses.fake_tensor", "FakeTensor"),
            ("torch._subclasses.functional_tensor", "FunctionalTensor"),
        )
    ]
    tracing = tuple(k for k in kinds if isinstance(k, type))
    return bool(tracing) and any(isinstance(item, tracing) for item in items)


def add(listener: Listener) -> None:
    """Call ``listener`` at every backward pass from now on (installs the wrappers)."""
    with _lock:
        _listeners.append(weakref.ref(listener))
        for name in ("backward", "grad"):
            current = getattr(torch.autograd, name)
            if current is _wrappers.get(name):
                continue
            _originals[name] = current
            _wrappers[name] = _wrap(name, current)
            setattr(torch.autograd, name, _wrappers[name])


def remove(listener: Listener) -> None:
    """Stop calling ``listener``; the last one out puts torch's functions back where they
    are still ours."""
    with _lock:
        _listeners[:] = [r for r in _listeners if r() is not None and r() is not listener]
        if _listeners:
            return
        for name in list(_wrappers):
            if getattr(torch.autograd, name) is _wrappers[name]:
                setattr(torch.autograd, name, _originals.pop(name))
                del _wrappers[name]


def installed() -> bool:
    """Whether torch.autograd.backward is our wrapper now."""
    return getattr(torch.autograd.backward, "__memlab_rs_wrapper__", None) == "backward"
