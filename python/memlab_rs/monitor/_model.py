"""What the monitor reads of the user's model, its forward calls and its arguments: the
parameter rows (one per storage, tied weights once), a tensor's storage on the monitored
device, the key of a forward call (what its allocations depend on that is known before it
runs), the monitored device and the constructor's argument checks."""

from __future__ import annotations

import os
from typing import Any

import torch

from .. import _torch


def storage_of(t: torch.Tensor, device_index: int) -> tuple[int, int] | None:
    """(storage address, bytes) of a tensor on the monitored device, else None."""
    try:
        if t.get_device() != device_index or t.is_meta:
            return None
        s = t.untyped_storage()
        ptr = s.data_ptr()
        return (ptr, s.nbytes()) if ptr else None
    except (RuntimeError, NotImplementedError, TypeError):
        return None  # sparse, nested or a wrapper subclass: no storage of its own


_SCALARS = (int, float, bool, str, type(None))


def autocast_state(device_type: str) -> tuple[bool, Any]:
    """Whether autocast is on for ``device_type``, and its dtype."""
    try:  # torch >= 2.4
        return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    except (TypeError, AttributeError):  # older torch: one function per device type
        if device_type == "cuda":
            return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()
        return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()


def call_key(args: Any, kwargs: Any, training: bool, device_type: str) -> tuple[Any, ...]:
    """What a forward call's allocations depend on that can be read before it runs: each
    tensor's shape, dtype, device and requires_grad, scalars' values, containers' lengths
    (three levels deep), other arguments' types, the training flag, grad mode and autocast
    on the monitored device type."""
    key: list[Any] = [training, torch.is_grad_enabled(), autocast_state(device_type)]

    def add(value: Any, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            key.append((value.shape, value.dtype, value.device, value.requires_grad))
        elif isinstance(value, _SCALARS):
            key.append(value)
        elif depth < 3 and isinstance(value, (list, tuple)):
            key.append(len(value))
            for item in value:
                add(item, depth + 1)
        elif depth < 3 and isinstance(value, dict):
            key.append(len(value))
            for name, item in value.items():
                key.append(name)
                add(item, depth + 1)
        else:
            key.append(type(value))

    add(args, 0)
    add(kwargs, 0)
    return tuple(key)


def param_rows(model: torch.nn.Module) -> list[tuple[str, list[Any], int]]:
    """(names joined by '+', the parameters, storage bytes), one per parameter storage:
    tied weights once, under all their names."""
    by_storage: dict[int, tuple[list[str], list[Any], int]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        s = p.untyped_storage()
        entry = by_storage.setdefault(s.data_ptr(), ([], [], s.nbytes()))
        if name not in entry[0]:
            entry[0].append(name)
        if not any(q is p for q in entry[1]):
            entry[1].append(p)
    return [("+".join(n), ps, b) for n, ps, b in by_storage.values()]


def monitored_device(model: torch.nn.Module, device: Any) -> str:
    if device is None:
        first = next(iter(model.parameters()), None)
        if first is None:
            return "cpu"
        device = first.device
    key = _torch.report_device(device, "device")
    if key != "cpu" and not key.startswith("cuda:"):
        raise ValueError(
            f"memory_profiler: device={device!r}: only 'cpu' and CUDA devices have an "
            "allocator to read (pass device='cpu' or 'cuda:N')"
        )
    return key


def check_arguments(
    model: Any,
    print_period: Any,
    csv: Any,
    optimizer: Any,
    verbose: Any,
    csv_dir: Any,
    file: Any,
) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"memory_profiler: model must be a torch.nn.Module, got {type(model).__name__}"
        )
    if isinstance(print_period, bool) or not isinstance(print_period, int) or print_period < 1:
        raise ValueError(
            f"memory_profiler: print_period must be an integer >= 1 (print every N "
            f"iterations), got {print_period!r}"
        )
    for name, value in (("csv", csv), ("verbose", verbose)):
        if not isinstance(value, bool):
            raise TypeError(f"memory_profiler: {name} must be True or False, got {value!r}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            "memory_profiler: optimizer must be a torch.optim.Optimizer (its state is "
            f"counted), got {type(optimizer).__name__}"
        )
    if not isinstance(csv_dir, (str, os.PathLike)):
        raise TypeError(f"memory_profiler: csv_dir must be a path, got {csv_dir!r}")
    if file is not None and not callable(getattr(file, "write", None)):
        raise TypeError(f"memory_profiler: file must have a write() method, got {file!r}")
