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
from collections.abc import Iterator
from typing import Any

import torch

from .. import _torch

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


def live_tensors(
    device: str, models: dict[str, torch.nn.Module], optimizers: dict[str, Any]
) -> dict[str, Any]:
    """The device's live storages by name (the tensor report's walk), biggest first."""
    from ..tensor_report import MemReporter

    # A model given alone is named as MemReporter names it ("weight"); models found in the
    # frames or given by name are prefixed by that name ("model.weight").
    model: torch.nn.Module | None = None
    if list(models) == [""]:
        model = models[""]
    elif models:
        model = torch.nn.ModuleDict(
            {(k or "model").replace(".", "_"): v for k, v in models.items()}
        )
    reporter = MemReporter(model)
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


def _frame_tensors(frames: list[types.FrameType]) -> Iterator[torch.Tensor]:
    for frame in frames:
        for value in list(frame.f_locals.values()):
            if isinstance(value, torch.Tensor):
                yield value
            elif isinstance(value, (list, tuple)) and len(value) < 1000:
                yield from (v for v in value if isinstance(v, torch.Tensor))


def _storage_key(t: torch.Tensor) -> tuple[int, int] | None:
    try:
        s = t.untyped_storage()
        return (int(s.data_ptr()), int(s.nbytes()))
    except Exception:  # a tensor without storage (meta, sparse, freed saved variable)
        return None


def autograd_saved(
    device: torch.device,
    frames: list[types.FrameType],
    models: dict[str, torch.nn.Module],
    optimizers: dict[str, Any],
) -> dict[str, Any] | None:
    """The tensors autograd saved for backward in the graphs reachable from the frames'
    tensors, on `device`, each storage once, leaving out the storages Python names
    (parameters, buffers, optimizer state, the frames' own tensors): the activations."""
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
    for t in _frame_tensors(frames):
        if t.device == device:
            key = _storage_key(t)
            if key is not None:
                named.add(key[0])
        if t.grad_fn is not None:
            roots.append(t.grad_fn)
    if not roots:
        return None
    seen_nodes: set[int] = set()
    saved: dict[int, int] = {}
    stack = list(roots)
    complete = True
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen_nodes:
            continue
        if len(seen_nodes) >= AUTOGRAD_NODES:
            complete = False
            break
        seen_nodes.add(id(node))
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            try:
                value = getattr(node, attr)
            except Exception:  # freed after a backward, or not a tensor we can read
                continue
            values = value if isinstance(value, (tuple, list)) else (value,)
            for v in values:
                if isinstance(v, torch.Tensor) and v.device == device:
                    key = _storage_key(v)
                    if key is not None and key[0] not in named and key[1] > 0:
                        saved[key[0]] = key[1]
        for child, _ in getattr(node, "next_functions", ()):
            if child is not None:
                stack.append(child)
    return {
        "saved_bytes": sum(saved.values()),
        "saved_count": len(saved),
        "nodes": len(seen_nodes),
        "complete": complete,
    }


# -- the CUDA device ----------------------------------------------------------------------


def _pool_name(pool_id: Any) -> str:
    if not pool_id or tuple(pool_id) == (0, 0):
        return "default"
    return ",".join(str(int(p)) for p in pool_id)


def _allocator_settings() -> tuple[bool, int | None]:
    """Whether expandable segments are on, and max_split_size in bytes (None: unlimited),
    as PYTORCH_CUDA_ALLOC_CONF (or torch's own setter) asked."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") or os.environ.get("PYTORCH_ALLOC_CONF", "")
    expandable = bool(re.search(r"expandable_segments\s*:\s*true", conf, re.I))
    split = re.search(r"max_split_size_mb\s*:\s*(\d+)", conf)
    return expandable, (int(split.group(1)) << 20 if split else None)


def segments(index: int) -> tuple[list[dict[str, Any]], bool, bool]:
    """The allocator's segments on device `index` (the largest SEGMENTS_KEPT), whether all
    were kept, and whether any is expandable."""
    rows: list[dict[str, Any]] = []
    expandable = False
    for seg in torch.cuda.memory_snapshot():
        if int(seg.get("device", index)) != index:
            continue
        expandable = expandable or bool(seg.get("is_expandable", False))
        free, used, offset = [], [], 0
        for block in seg.get("blocks", []):
            size = int(block["size"])
            if block.get("state") == "inactive":
                free.append([offset, size])
            else:
                used.append(size)
            offset += size
        rows.append(
            {
                "pool": _pool_name(seg.get("segment_pool_id")),
                "stream": int(seg.get("stream", 0)),
                "segment_type": str(seg.get("segment_type", "large")),
                "total_size": int(seg["total_size"]),
                "free_blocks": free,
                "used_blocks": used,
                "expandable": bool(seg.get("is_expandable", False)),
            }
        )
    rows.sort(key=lambda s: -int(s["total_size"]))
    return rows[:SEGMENTS_KEPT], len(rows) <= SEGMENTS_KEPT, expandable


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
    except Exception:  # no pynvml, no NVML, another pid namespace: not known
        return None
    return None


def cuda_memory(index: int, total: int | None, driver_free: int | None) -> dict[str, Any]:
    """The device's figures (the observer's total and free when it gave them)."""
    stats = torch.cuda.memory_stats(index)
    if total is None or driver_free is None:
        driver_free, total = torch.cuda.mem_get_info(index)
    segs, complete, any_expandable = segments(index)
    expandable, max_split = _allocator_settings()
    return {
        "total": int(total),
        "driver_free": int(driver_free),
        "reserved": int(stats.get("reserved_bytes.all.current", 0)),
        "allocated": int(stats.get("allocated_bytes.all.current", 0)),
        "inactive_split": int(stats.get("inactive_split_bytes.all.current", 0)),
        "expandable_segments": expandable or any_expandable,
        "max_split_size": max_split,
        "process_used": _nvml_process_used(index),
        "segments": segs,
        "segments_complete": complete,
    }


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
