"""The facts of a post-mortem, gathered at the failing allocation: the device's figures and
segments, the failing stack, the live tensors by name, what autograd holds for backward, the
host's memory. Each gatherer reads only; none allocates on a device.

Bounds (so that explaining an out-of-memory error never becomes one): at most
``SEGMENTS_KEPT`` segments (the largest), ``TENSOR_ROWS`` tensor rows (the totals cover all),
``AUTOGRAD_NODES`` autograd nodes walked, ``STACK_FRAMES`` frames."""

from __future__ import annotations

import os
import re
import types
from typing import Any

import torch

from .. import _torch
from .._interrupts import reraise_interrupt

SEGMENTS_KEPT = 10_000
TENSOR_ROWS = 50
AUTOGRAD_NODES = 100_000
STACK_FRAMES = 50

#: The folder of this package: its frames are not the user's.
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))


# -- the stack ----------------------------------------------------------------------------


def user_frames(frame: types.FrameType | None) -> list[types.FrameType]:
    """The frames from `frame` outwards, ours left out, innermost first (at most
    STACK_FRAMES)."""
    found: list[types.FrameType] = []
    while frame is not None and len(found) < STACK_FRAMES:
        if not os.path.abspath(frame.f_code.co_filename).startswith(_OURS):
            found.append(frame)
        frame = frame.f_back
    return found


def frames_of_traceback(tb: types.TracebackType | None) -> list[types.FrameType]:
    """The traceback's frames, innermost first, ours left out."""
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    inner = frames[-1] if frames else None
    # the innermost frame outwards: the same order as user_frames
    return user_frames(inner)


def stack_rows(frames: list[types.FrameType]) -> list[dict[str, Any]]:
    """Frames as rows, outermost first."""
    return [
        {"file": f.f_code.co_filename, "line": int(f.f_lineno or 0), "function": f.f_code.co_name}
        for f in reversed(frames)
    ]


# -- names: the models and optimizers the guard was given or the failing frames hold -------


def found_objects(
    frames: list[types.FrameType], models: dict[str, Any], optimizers: dict[str, Any]
) -> tuple[dict[str, torch.nn.Module], dict[str, torch.optim.Optimizer]]:
    """The models and optimizers given, and those the frames' locals and globals hold (by
    variable name; a module that is a submodule of another found one is left out)."""
    mods = {k: v for k, v in models.items() if isinstance(v, torch.nn.Module)}
    opts = {k: v for k, v in optimizers.items() if isinstance(v, torch.optim.Optimizer)}
    seen = {id(v) for v in [*mods.values(), *opts.values()]}
    for frame in frames:
        for space in (frame.f_locals, frame.f_globals):
            for name, value in list(space.items()):
                if id(value) in seen or name.startswith("__"):
                    continue
                if isinstance(value, torch.nn.Module):
                    mods[name] = value
                    seen.add(id(value))
                elif isinstance(value, torch.optim.Optimizer):
                    opts[name] = value
                    seen.add(id(value))
    inner = {id(m) for top in mods.values() for m in top.modules() if m is not top}
    mods = {k: v for k, v in mods.items() if id(v) not in inner}
    return mods, opts


def frame_names(frames: list[types.FrameType]) -> list[tuple[torch.Tensor, str]]:
    """The tensors the failing frames' variables hold, named ``function:variable`` (an
    element of a list or tuple ``function:variable[i]``), innermost frame first."""
    named = []
    for frame in frames:
        where = frame.f_code.co_name
        for name, value in list(frame.f_locals.items()):
            if isinstance(value, torch.Tensor):
                named.append((value, f"{where}:{name}"))
            elif isinstance(value, (list, tuple)) and len(value) <= 1000:
                named += [
                    (v, f"{where}:{name}[{i}]")
                    for i, v in enumerate(value)
                    if isinstance(v, torch.Tensor)
                ]
    return named


def live_tensors(
    device: str,
    models: dict[str, torch.nn.Module],
    optimizers: dict[str, Any],
    frame_names: list[tuple[torch.Tensor, str]],
) -> dict[str, Any]:
    """The device's live storages by name (the tensor report's walk), biggest first: the
    models' and optimizers' names, then the failing frames' variables."""
    from ..tensor_report import MemReporter

    class _WithFrameNames(MemReporter):
        # The tensor report names what a model and its optimizers hold; a post-mortem also
        # names what the failing frames' variables hold (the activations being computed).
        def __init__(self, model: Any, extra: list[tuple[torch.Tensor, str]]):
            super().__init__(model)
            self._extra = extra

        def _named_tensors(self) -> list[tuple[torch.Tensor, str]]:
            return super()._named_tensors() + self._extra

    # A model given alone is named as MemReporter names it ("weight"); models found in the
    # frames or given by name are prefixed by that name ("model.weight").
    model: torch.nn.Module | None = None
    if list(models) == [""]:
        model = models[""]
    elif models:
        model = torch.nn.ModuleDict(
            {(k or "model").replace(".", "_"): v for k, v in models.items()}
        )
    reporter = _WithFrameNames(model, frame_names)
    for opt in optimizers.values():
        reporter.add_optimizer(opt)
    report = reporter.collect(device=device, sort_by="size", top=TENSOR_ROWS)
    sections = [s for s in report.to_data()["sections"] if s["device"] == device]
    rows, total, count = [], 0, 0
    for section in sections:
        total += int(section["total_bytes"])
        count += len(section["rows"]) + int(section["omitted_rows"])
        for r in section["rows"]:
            if r["bytes"] == 0:  # a view of a storage another row owns
                count -= 1
                continue
            rows.append(
                {
                    "name": r["name"],
                    "shape": list(r["shape"] or []),
                    "dtype": str(r["dtype"]).replace("torch.", ""),
                    "bytes": int(r["bytes"]),
                }
            )
    return {"tensors": rows, "tensor_bytes": total, "tensor_count": max(count, 0)}


# -- what autograd holds for backward -----------------------------------------------------


def _storage_key(t: torch.Tensor) -> tuple[int, int] | None:
    try:
        s = t.untyped_storage()
        return (int(s.data_ptr()), int(s.nbytes()))
    except Exception as error:  # a tensor without storage (meta, sparse, freed saved variable)
        reraise_interrupt(error)
        return None


def autograd_saved(
    device: torch.device,
    frame_tensors: list[tuple[torch.Tensor, str]],
    models: dict[str, torch.nn.Module],
    optimizers: dict[str, Any],
) -> dict[str, Any] | None:
    """The tensors autograd saved for backward in the graphs of every live tensor (the gc
    walk's, and the failing frames'), on `device`, each storage once, leaving out the
    storages Python names (parameters, buffers, optimizer state, the frames' own tensors):
    the activations. `frame_tensors` are the frames' tensors as ``frame_names`` finds them.
    At most AUTOGRAD_NODES nodes are walked."""
    named: set[int] = set()
    for m in models.values():
        named.update(int(t.untyped_storage().data_ptr()) for t in m.parameters())
        named.update(int(t.untyped_storage().data_ptr()) for t in m.buffers())
    for opt in optimizers.values():
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    named.add(int(v.untyped_storage().data_ptr()))
    roots = []
    for t, _name in frame_tensors:
        if t.device == device:
            key = _storage_key(t)
            if key is not None:
                named.add(key[0])
        if t.grad_fn is not None:
            roots.append(t.grad_fn)
    # Every live tensor's graph too (the gc walk's tensors): the activations of a forward
    # pass are often held only by the graph of an output the frames no longer name.
    from .. import _core

    found, _strategy, _incomplete = _core.tracked_tensors()
    roots += [t.grad_fn for t in found if getattr(t, "grad_fn", None) is not None]
    del found
    if not roots:
        return None
    saved: dict[int, int] = {}
    nodes = 0
    complete = True
    for node in _torch.autograd_nodes(roots):
        if nodes >= AUTOGRAD_NODES:
            complete = False
            break
        nodes += 1
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            try:
                values = _torch.saved_values(node, attr)
            except Exception as error:  # freed after a backward, or not a tensor we can read
                reraise_interrupt(error)
                continue
            for v in values:
                if isinstance(v, torch.Tensor) and v.device == device:
                    key = _storage_key(v)
                    if key is not None and key[0] not in named and key[1] > 0:
                        saved[key[0]] = key[1]
    return {
        "saved_bytes": sum(saved.values()),
        "saved_count": len(saved),
        "nodes": nodes,
        "complete": complete,
    }


# -- the CUDA device ----------------------------------------------------------------------


def _nvml_process_used(index: int) -> int | None:
    """This process's memory on the device as NVML reports it (pynvml, when installed)."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        count = pynvml.nvmlDeviceGetCount()
        for i in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            if uuid in str(pynvml.nvmlDeviceGetUUID(handle)):
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if p.pid == os.getpid() and p.usedGpuMemory:
                        return int(p.usedGpuMemory)
    except Exception as error:  # no pynvml, no NVML, another pid namespace: not known
        reraise_interrupt(error)
        return None
    return None


def cuda_memory(index: int, total: int | None, driver_free: int | None) -> dict[str, Any]:
    """The device's figures (the observer's total and free when it gave them)."""
    stats = torch.cuda.memory_stats(index)
    if total is None or driver_free is None:
        driver_free, total = torch.cuda.mem_get_info(index)
    return {
        "total": int(total),
        "driver_free": int(driver_free),
        "reserved": int(stats.get("reserved_bytes.all.current", 0)),
        "allocated": int(stats.get("allocated_bytes.all.current", 0)),
        "inactive_split": int(stats.get("inactive_split_bytes.all.current", 0)),
        "process_used": _nvml_process_used(index),
    }


def allocator_state(index: int, driver_free: int) -> dict[str, Any]:
    """What the fragmentation analysis reads (the segments without frames, the counters,
    the settings), with the driver's free memory at the failing allocation."""
    state = _torch.cuda_allocator_state(index)
    state["device_free_bytes"] = int(driver_free)
    return state


def fragmentation(state: dict[str, Any], need: int, stream: int) -> dict[str, Any]:
    """The allocator floor's fragmentation of `state`, with the verdict on a request of
    `need` bytes on `stream` in the default pools: torch's malloc path replayed."""
    from .allocator_fragmentation import from_snapshot

    result = from_snapshot(
        state["segments"],
        device=int(state["device"]),
        request=need,
        stream=stream,
        allocator_conf=state.get("allocator_conf", ""),
        max_split_size=state.get("max_split_size"),
        device_free_bytes=state.get("device_free_bytes"),
        allowed_bytes=state.get("allowed_bytes"),
        reported=state.get("reported"),
    )
    return result.to_data()


#: torch's CUDA message names the request rounded to two decimals of its unit.
_CUDA_REQUEST = re.compile(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)")
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def cuda_request_from_message(message: str) -> int | None:
    """The request an OOM message names, rounded up to the allocator's 512 bytes (its
    message keeps two decimals: within 0.5% of the request)."""
    found = _CUDA_REQUEST.search(message)
    if not found:
        return None
    size = float(found.group(1)) * _UNITS[found.group(2)]
    return max(512, -(-int(size) // 512) * 512)


# -- the host -----------------------------------------------------------------------------


def _proc_kib(path: str, key: str) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_memory() -> dict[str, Any]:
    limit = None
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        limit = None if soft == resource.RLIM_INFINITY else int(soft)
    except (ImportError, OSError, ValueError):
        pass
    return {
        "address_space_limit": limit,
        "address_space": _proc_kib("/proc/self/status", "VmSize:"),
        "resident": _proc_kib("/proc/self/status", "VmRSS:"),
        "available": _proc_kib("/proc/meminfo", "MemAvailable:"),
    }


#: torch's CPU allocator's message names the exact bytes asked for.
_CPU_REQUEST = re.compile(r"tried to allocate (\d+) bytes")


def cpu_request(message: str) -> int | None:
    found = _CPU_REQUEST.search(message)
    return int(found.group(1)) if found else None


def is_cpu_oom(error: BaseException) -> bool:
    return isinstance(error, MemoryError) or (
        isinstance(error, RuntimeError)
        and not isinstance(error, _torch_oom_types())
        and "DefaultCPUAllocator" in str(error)
    )


def _torch_oom_types() -> tuple[type, ...]:
    found = getattr(torch, "OutOfMemoryError", None) or getattr(
        torch.cuda, "OutOfMemoryError", None
    )
    return (found,) if isinstance(found, type) else ()


def is_cuda_oom(error: BaseException) -> bool:
    kinds = _torch_oom_types()
    if kinds and isinstance(error, kinds):
        return True
    return isinstance(error, RuntimeError) and "CUDA out of memory" in str(error)


def cuda_index_of_error(error: BaseException) -> int:
    """The device an OOM message names (``GPU 1``), else the current device."""
    found = re.search(r"GPU (\d+)", str(error))
    return int(found.group(1)) if found else _torch.local_cuda_index()


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".strip()
