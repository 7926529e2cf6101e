"""What was alive when a trace began, named by tensor: the storage address of every
parameter, buffer, gradient and optimizer state on the traced device, with the name
MemReporter gives it (``0.weight``, ``0.weight.grad``, ``Adam.0.weight.exp_avg``).

The trace's module view then shows ``untraced:<name>`` for those allocations instead of one
``untraced`` row, so keyword groups such as ``{"weights": ["weight"]}`` find the weights.
An allocation's address is its storage's ``data_ptr()`` (CPU: what ``posix_memalign`` gave;
CUDA: the caching allocator's block), which is how the recording knows it.

The model is the Tracer's ``model``; without one, every root module the gc walk finds (a
module no other live module holds as a child) with tensors on the device, each named by its
class when there are several. Optimizers are found by the gc walk. Only names and addresses
are kept: no tensor, module or optimizer outlives the call.

>>> import torch
>>> lin = torch.nn.Linear(4, 4)
>>> names = dict((name, address) for address, name in start_names(lin, "cpu"))
>>> names["weight"] == lin.weight.untyped_storage().data_ptr()
True
"""

from __future__ import annotations

import collections
from typing import Any

import torch

from .. import _core, _torch
from .._interrupts import reraise_interrupt


def start_names(model: torch.nn.Module | None, device: str) -> list[list[Any]]:
    """``[address, name]`` for each named tensor whose storage is on ``device`` (``"cpu"``
    or ``"cuda:N"``), by address; the first name an address gets is kept."""
    on_device = _on(device)
    if model is not None:
        roots = [("", model)]
    else:
        roots = _prefixed(r for r in _found(torch.nn.Module, _roots) if _has_tensor(r, on_device))
    named: list[tuple[torch.Tensor, str]] = []
    for prefix, root in roots:
        try:
            named.extend((t, prefix + name) for t, name in _torch.module_tensor_names(root))
        except Exception as error:  # a module in a state its own methods cannot list: unnamed
            reraise_interrupt(error)
            continue
    param_names = {id(t): name for t, name in named}
    for optimizer in _found(torch.optim.Optimizer, list):
        try:
            named.extend(_torch.optimizer_tensor_names(optimizer, param_names))
        except Exception as error:
            reraise_interrupt(error)
            continue
    by_address: dict[int, str] = {}
    for tensor, name in named:
        for each, label in ((tensor, name), (_grad(tensor), f"{name}.grad")):
            address = _address(each, on_device)
            if address:
                by_address.setdefault(address, label)
    return [[address, name] for address, name in sorted(by_address.items())]


def _on(device: str) -> tuple[str, int | None]:
    if device == "cpu":
        return ("cpu", None)
    return ("cuda", int(device.split(":")[1]))


def _address(tensor: Any, on_device: tuple[str, int | None]) -> int:
    """The storage address of ``tensor`` when it is a tensor on the device, else 0."""
    if not isinstance(tensor, torch.Tensor):
        return 0
    try:
        dev = tensor.device
        if dev.type != on_device[0] or (on_device[1] is not None and dev.index != on_device[1]):
            return 0
        return int(tensor.untyped_storage().data_ptr())
    except Exception as error:  # no storage of its own (a wrapper subclass), an uninitialised one
        reraise_interrupt(error)
        return 0


def _grad(tensor: torch.Tensor) -> Any:
    """``tensor.grad`` of a leaf (reading it on a non-leaf makes torch warn)."""
    try:
        return tensor.grad if tensor.is_leaf else None
    except Exception as error:
        reraise_interrupt(error)
        return None


def _has_tensor(module: torch.nn.Module, on_device: tuple[str, int | None]) -> bool:
    try:
        return any(_address(t, on_device) for t, _ in _torch.module_tensor_names(module))
    except Exception as error:
        reraise_interrupt(error)
        return False


def _found(cls: type, keep: Any) -> list[Any]:
    """The live instances of ``cls`` the gc walk finds, passed through ``keep``; none
    where the walk or ``keep`` fails (names are a help: they never stop a trace)."""
    found: list[Any] = []
    try:
        found = _core._instances_of(cls)[0]
        return list(keep(found))
    except Exception as error:
        reraise_interrupt(error)
        return []
    finally:
        del found  # the walk's references to every instance go now


def _roots(modules: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """The modules no other module of ``modules`` holds as a child."""
    children: set[int] = set()
    for module in modules:
        held = module.__dict__.get("_modules")
        if isinstance(held, dict):
            children.update(id(child) for child in list(held.values()) if child is not None)
    return [m for m in modules if id(m) not in children]


def _prefixed(roots: Any) -> list[tuple[str, torch.nn.Module]]:
    """One root is named as a model passed to the Tracer is (``0.weight``); several by
    their class (``Net.0.weight``), numbered where a class repeats (``Net[1].0.weight``)."""
    roots = list(roots)
    if len(roots) == 1:
        return [("", roots[0])]
    classes = collections.Counter(type(r).__name__ for r in roots)
    seen: collections.Counter[str] = collections.Counter()
    out = []
    for root in roots:
        name = type(root).__name__
        if classes[name] > 1:
            name, seen[name] = f"{name}[{seen[name]}]", seen[name] + 1
        out.append((f"{name}.", root))
    return out
