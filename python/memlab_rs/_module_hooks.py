"""Hooks of ours on a user's modules, kept out of what ``copy.deepcopy``, ``pickle`` and
``torch.save`` take of those modules.

A hook registered on a module is an entry of its hook dicts (``_forward_pre_hooks``,
``_forward_hooks``, ...), and ``Module.__getstate__`` hands them to pickle and deepcopy
with the rest of the module's ``__dict__``. A monitor's hook there broke all three (it is
bound to the monitor, which holds a lock and Rust objects); a picklable one would still tie
the user's file to memlab_rs (loading it would need memlab_rs installed, and allowlisted
under ``weights_only=True``), and would make a copy of the model call the monitor.

So our hooks are ``Hook`` objects, and while any is registered ``torch.nn.Module.__getstate__``
is wrapped: the state it returns has copies of the hook dicts without our hooks (the module
keeps its own). The wrapper is installed with the first hook and put back when the last one
is removed (or collected with its module, a tool dropped without being stopped), unless
something wrapped ``__getstate__`` since (then ours stays, passing through).
``copy.copy``, ``copy.deepcopy``, ``pickle`` and ``torch.save`` all take a module's state
through ``__getstate__``; a subclass that overrides it without calling
``super().__getstate__()`` is not covered, and pickling our hook then says what to do.

Why not torch's global module hooks, which leave the modules untouched: while one exists,
every module call in the process takes ``Module._call_impl``'s slow path (1.4 us more per
call on a 2-core Xeon), ``torch.compile(model)`` warns at every call, and a global
forward pre-hook gets no keyword arguments.

>>> import copy, pickle, torch
>>> from memlab_rs import _module_hooks
>>> calls = []
>>> model = torch.nn.Linear(2, 2)
>>> handle = _module_hooks.register_forward_pre_hook(model, lambda m, args: calls.append(m))
>>> _ = model(torch.ones(2))
>>> _ = copy.deepcopy(model)(torch.ones(2))  # the copy has no hook of ours
>>> len(calls), b"memlab_rs" in pickle.dumps(model)
(1, False)
>>> handle.remove()
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, Callable

import torch

# Reentrant: a hook collected during a collection that our own code set off releases too.
_lock = threading.RLock()
# Weak references to the hooks of ours registered and not removed.
_live: set[weakref.ref[Hook]] = set()
_original: Callable[[torch.nn.Module], Any] | None = None
_wrapper: Callable[[torch.nn.Module], Any] | None = None


class Hook:
    """A hook of ours on a user's module: calls ``fn`` and is left out of the module's
    state."""

    __slots__ = ("_fn", "__weakref__")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)

    def __reduce__(self) -> Any:
        raise TypeError(
            "a memlab_rs hook on a module cannot be pickled: this module's class overrides "
            "__getstate__ without calling super().__getstate__(), which leaves memlab_rs's "
            "hooks out; call it there, or stop() the memlab_rs tool before saving"
        )


class Handle:
    """What ``register_*`` return: ``remove()`` takes the hook off (once)."""

    def __init__(self, handle: Any, hook: weakref.ref[Hook]) -> None:
        self._handle: Any = handle
        self._hook = hook

    def remove(self) -> None:
        if self._handle is None:
            return
        self._handle.remove()
        self._handle = None
        _release(self._hook)


def register_forward_pre_hook(
    module: torch.nn.Module, fn: Callable[..., Any], **options: Any
) -> Handle:
    """``module.register_forward_pre_hook(fn, **options)``, as a hook of ours."""
    hook = Hook(fn)
    return Handle(module.register_forward_pre_hook(hook, **options), _acquire(hook))


def register_forward_hook(
    module: torch.nn.Module, fn: Callable[..., Any], **options: Any
) -> Handle:
    """``module.register_forward_hook(fn, **options)``, as a hook of ours."""
    hook = Hook(fn)
    return Handle(module.register_forward_hook(hook, **options), _acquire(hook))


def without_our_hooks(state: dict[str, Any]) -> dict[str, Any]:
    """A module's state with our hooks left out of its hook dicts (copies of those that
    held one; the flag dicts keyed by a hook's id, ``_forward_hooks_with_kwargs`` and the
    like, lose that id too)."""
    ours = {
        key
        for name, value in state.items()
        if "hooks" in name and isinstance(value, dict)
        for key, hook in value.items()
        if isinstance(hook, Hook)
    }
    if not ours:
        return state
    state = dict(state)
    for name, value in state.items():
        if "hooks" in name and isinstance(value, dict) and not ours.isdisjoint(value):
            kept = type(value)() if type(value) is not dict else {}
            for key, item in value.items():
                if key not in ours:
                    kept[key] = item
            state[name] = kept
    return state


def _getstate(original: Callable[[torch.nn.Module], Any]) -> Callable[[torch.nn.Module], Any]:
    @functools.wraps(original)
    def __getstate__(self: torch.nn.Module) -> Any:
        state = original(self)
        return without_our_hooks(state) if isinstance(state, dict) else state

    __getstate__.__memlab_rs_wrapper__ = True  # type: ignore[attr-defined]
    return __getstate__


def _acquire(hook: Hook) -> weakref.ref[Hook]:
    """Count ``hook`` as registered (until removed or collected); wrap ``__getstate__``."""
    global _original, _wrapper
    with _lock:
        ref = weakref.ref(hook, _release)
        _live.add(ref)
        current = torch.nn.Module.__getstate__
        if current is not _wrapper:
            _original = current
            _wrapper = _getstate(current)
            torch.nn.Module.__getstate__ = _wrapper  # type: ignore[method-assign]
        return ref


def _release(hook: weakref.ref[Hook]) -> None:
    """``hook`` is removed (or was collected); the last one out puts torch's back."""
    global _original, _wrapper
    with _lock:
        _live.discard(hook)
        if _live or _wrapper is None:
            return
        if torch.nn.Module.__getstate__ is _wrapper and _original is not None:
            torch.nn.Module.__getstate__ = _original  # type: ignore[method-assign]
            _original = _wrapper = None


def installed() -> bool:
    """Whether ``torch.nn.Module.__getstate__`` is our wrapper now."""
    return getattr(torch.nn.Module.__getstate__, "__memlab_rs_wrapper__", False)
