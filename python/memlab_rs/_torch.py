"""The one place that touches torch internals; version differences live here.

Importing this module imports torch but never initialises CUDA.
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from . import _args


def cuda_ready() -> bool:
    """Whether CUDA is already initialised in this process (asking never initialises it)."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def local_cuda_index() -> int:
    """This process's GPU: the current device once CUDA is initialised, else torchrun's
    ``LOCAL_RANK`` (modulo the GPUs this process sees, so a rank given one GPU through
    ``CUDA_VISIBLE_DEVICES`` gets index 0), else 0. Never initialises CUDA.

    The tools default to it, so under ``torchrun`` each rank profiles its own GPU, even when
    a profiler is made (at ``@profile``, say) before the script calls ``set_device``.
    """
    if cuda_ready():
        return torch.cuda.current_device()
    try:
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        return 0
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return local % count if count > 0 and local >= 0 else 0


def device_key(device: torch.device | str | int, name: str = "device") -> str:
    """The report's name for a device: ``"cuda:0"``, ``"cpu"``, ``"meta"``.

    A bare ``"cuda"`` means the current CUDA device, as in torch; an int (or any
    integer-like value) is a CUDA index. Anything else is a TypeError or ValueError that
    names the parameter ``name``.
    """
    dev = parse_device(device, name)
    if dev.type == "cuda" and dev.index is None:
        index = torch.cuda.current_device() if cuda_ready() else 0
        return f"cuda:{index}"
    return str(dev)


def report_device(device: torch.device | str | int, name: str = "device") -> str:
    """``device_key(device)``, and for CUDA a ValueError when that device does not exist
    (counting devices does not initialise CUDA)."""
    key = device_key(device, name)
    if key.startswith("cuda:"):
        cuda_index_exists(int(key[5:]), f"{name}={device!r}")
    return key


def parse_device(device: object, name: str) -> torch.device:
    """``device`` as a ``torch.device`` (a device, a string such as ``"cuda:1"`` or a CUDA
    index); a TypeError or ValueError naming ``name`` otherwise, also for an index torch
    would wrap round (``"cuda:256"`` is cuda:0 to torch)."""
    if isinstance(device, torch.device):
        return device
    if isinstance(device, str):
        try:
            dev = torch.device(device)
        except RuntimeError as error:
            raise ValueError(f"{name}={device!r} is not a device: {error}") from None
        written = re.fullmatch(r"[a-z_]+:(\d+)", device)
        if written is not None:
            same_index(int(written.group(1)), dev, device, name)
        return dev
    if not isinstance(device, bool):
        try:
            index = operator.index(device)  # type: ignore[arg-type]
        except TypeError:
            pass
        else:
            if index < 0:
                raise ValueError(
                    f"{name}={device!r}: a CUDA device index is 0 or more (use 'cpu' for the CPU)"
                )
            try:
                dev = torch.device("cuda", index)
            except (ValueError, OverflowError, RuntimeError):  # beyond a C long long
                dev = torch.device("cuda")
            same_index(index, dev, device, name)
            return dev
    raise TypeError(
        f"{name} must be a torch.device, a device string ('cpu', 'cuda:0') or a CUDA device "
        f"index, got {device!r} ({type(device).__name__})"
    )


def same_index(index: int, dev: torch.device, given: object, name: str) -> None:
    """torch keeps a device index in a small integer and wraps what does not fit
    (``torch.device("cuda", 200)`` is cuda:-56, ``"cuda:256"`` is cuda:0): refuse it."""
    if dev.index != index:
        raise ValueError(
            f"{name}={_args.shown(given)}: no device has that index (torch numbers devices "
            "with small integers, 0 to 127)"
        )


def cuda_index_exists(index: int, what: str) -> None:
    """Raise a ValueError saying why CUDA device ``index`` does not exist (``what`` names
    the argument that asked for it); return if it does. Never initialises CUDA."""
    if not torch.cuda.is_available():
        raise ValueError(
            f"{what}: CUDA is not available on this machine (torch sees no GPU), so there is "
            f"no cuda:{index}; only CPU memory can be profiled or reported here (device='cpu')"
        )
    count = torch.cuda.device_count()
    if index >= count:
        raise ValueError(
            f"{what}: there is no cuda:{index}; this machine has {count} CUDA device(s), "
            f"cuda:0 to cuda:{count - 1}"
        )


def cuda_devices_with_memory() -> list[str]:
    """CUDA devices on which the caching allocator holds memory, without initialising CUDA."""
    if not cuda_ready():
        return []
    return [
        f"cuda:{i}" for i in range(torch.cuda.device_count()) if torch.cuda.memory_allocated(i) > 0
    ]


def cuda_allocator_figures(device: str) -> tuple[int, int | None, int | None]:
    """(allocated, requested, reserved) bytes of the caching allocator on ``device``.

    ``requested`` (what callers asked for, before rounding) is None on builds without it.
    """
    stats = torch.cuda.memory_stats(device)
    allocated = int(stats.get("allocated_bytes.all.current", torch.cuda.memory_allocated(device)))
    requested = stats.get("requested_bytes.all.current")
    reserved = stats.get("reserved_bytes.all.current")
    return (
        allocated,
        None if requested is None else int(requested),
        None if reserved is None else int(reserved),
    )


def _named(items: Iterable[tuple[str, torch.Tensor]]) -> dict[int, tuple[torch.Tensor, list[str]]]:
    """Group names by tensor identity, so tied weights get every name they go by."""
    by_id: dict[int, tuple[torch.Tensor, list[str]]] = {}
    for name, tensor in items:
        if tensor is None:
            continue
        entry = by_id.setdefault(id(tensor), (tensor, []))
        if name not in entry[1]:
            entry[1].append(name)
    return by_id


def module_tensor_names(model: torch.nn.Module) -> Iterator[tuple[torch.Tensor, str]]:
    """(tensor, name) for every parameter and buffer of ``model``; tied ones joined by '+'."""
    params = _named(model.named_parameters(remove_duplicate=False))
    buffers = _named(model.named_buffers(remove_duplicate=False))
    for tensor, names in list(params.values()) + list(buffers.values()):
        yield tensor, "+".join(names)


def optimizer_tensor_names(
    optimizer: torch.optim.Optimizer, param_names: dict[int, str]
) -> Iterator[tuple[torch.Tensor, str]]:
    """(tensor, name) for an optimizer's parameters the model did not name and its state.

    State is named ``<Optimizer>.<param name>.<key>`` (``Adam.weight.exp_avg``); a parameter
    the model does not name is called ``<Optimizer>.param<i>`` by its position in the
    optimizer's param groups.
    """
    opt_name = type(optimizer).__name__
    index = 0
    for group in optimizer.param_groups:
        for param in group["params"]:
            name = param_names.get(id(param))
            if name is None:
                name = f"param{index}"
                yield param, f"{opt_name}.{name}"
            for key, value in optimizer.state.get(param, {}).items():
                yield from _state_tensors(value, f"{opt_name}.{name}.{key}")
            index += 1


def _state_tensors(value: object, name: str) -> Iterator[tuple[torch.Tensor, str]]:
    if isinstance(value, torch.Tensor):
        yield value, name
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _state_tensors(item, f"{name}.{i}")


def line_profiler_device(device: torch.device | str | int | None, target_gpu: int) -> str:
    """The line profiler's memory source: ``"cuda:N"`` or ``"cpu"``.

    None means CUDA (``target_gpu``) when it is available, else the CPU. Asking whether
    CUDA is available does not initialise it. A wrong value names the ``device`` parameter.
    """
    if device is None:
        return checked_cuda_device(target_gpu) if torch.cuda.is_available() else "cpu"
    dev = parse_device(device, "device")
    if dev.type == "cpu":
        return "cpu"
    if dev.type != "cuda":
        raise ValueError(
            f"device={device!r}: the line profiler reads CPU or CUDA memory, not {dev.type!r}"
        )
    return checked_cuda_device(target_gpu if dev.index is None else dev.index)


def checked_cuda_device(index: int) -> str:
    """``"cuda:N"`` if that device exists, else a ValueError that says what does.

    Counting devices does not initialise CUDA.
    """
    cuda_index_exists(index, f"cannot profile cuda:{index}")
    return f"cuda:{index}"


def check_target_gpu(index: int, given: object) -> None:
    """A ``target_gpu`` must name a device that exists. Without CUDA only the default, 0,
    is accepted (code written for a GPU keeps running and profiles the CPU); any other
    index is an error there too."""
    if torch.cuda.is_available() or index != 0:
        cuda_index_exists(index, f"target_gpu={given!r}")


def cuda_allocator_state(index: int) -> dict[str, Any]:
    """What the fragmentation analysis reads of CUDA device ``index``, as JSON values: its
    snapshot's segments (``torch.cuda.memory_snapshot()``, frames left out), the counters it
    checks them against, the allocator's settings and how much more the device could give.

    Before CUDA is initialised the allocator holds nothing: no segments, and nothing is
    asked of the device (asking would initialise CUDA).
    """
    if not cuda_ready():
        return {"device": index, "segments": [], "allocator_conf": allocator_settings()}
    backend = getattr(torch.cuda, "get_allocator_backend", lambda: "native")()
    if backend != "native":
        raise RuntimeError(
            f"the CUDA allocator backend is {backend!r}: only torch's caching allocator "
            "(backend 'native') keeps the segments this analysis reads"
        )
    try:  # 2.10+: no trace entries, which the analysis does not read (and cost time)
        segments = torch.cuda.memory_snapshot(include_traces=False)
    except TypeError:
        segments = torch.cuda.memory_snapshot()
    stats = torch.cuda.memory_stats(index)
    free, total = torch.cuda.mem_get_info(index)
    allowed = None
    get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # 2.7+
    if get_fraction is not None:
        fraction = get_fraction(index)
        if fraction < 1.0:
            allowed = int(fraction * total)
    return {
        "device": index,
        "segments": [_without_frames(s) for s in segments],
        "allocator_conf": allocator_settings(),
        "max_split_size": stats.get("max_split_size"),
        "reported": {
            "reserved_bytes": stats.get("reserved_bytes.all.current"),
            "allocated_bytes": stats.get("allocated_bytes.all.current"),
            "inactive_split_bytes": stats.get("inactive_split_bytes.all.current"),
        },
        "device_free_bytes": free,
        "allowed_bytes": allowed,
    }


def _without_frames(segment: dict[str, Any]) -> dict[str, Any]:
    """A snapshot segment without its stack frames (the analysis reads none; with history
    recorded they are most of its size)."""
    out = {k: v for k, v in segment.items() if k != "frames"}
    out["blocks"] = [{k: v for k, v in b.items() if k != "frames"} for b in segment["blocks"]]
    return out


def allocator_settings() -> str:
    """The CUDA caching allocator's settings text (``PYTORCH_CUDA_ALLOC_CONF``'s form): the
    last one torch parsed (2.8+ keeps it; ``torch.cuda.memory._set_allocator_settings``
    changes it at run time), else the environment's (``PYTORCH_ALLOC_CONF`` wins over the
    older ``PYTORCH_CUDA_ALLOC_CONF``, as in torch)."""
    for name in ("_accelerator_getAllocatorSettings", "_cuda_getAllocatorSettings"):
        getter = getattr(torch._C, name, None)
        if getter is not None:
            text = getter()
            if text:
                return str(text)
    return os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")


def cuda_stream_number(stream: Any, index: int) -> int:
    """The snapshot's number of ``stream`` (a ``torch.cuda.Stream``, or that number
    itself); None means the device's current stream (0 for the default stream)."""
    if stream is None:
        if not cuda_ready():
            return 0
        return int(torch.cuda.current_stream(index).cuda_stream)
    if isinstance(stream, torch.cuda.Stream):
        return int(stream.cuda_stream)
    if isinstance(stream, int) and not isinstance(stream, bool) and stream >= 0:
        return stream
    raise TypeError(
        f"stream must be a torch.cuda.Stream, the snapshot's stream number (an int, 0 for "
        f"the default stream) or None for the current stream, got {_args.shown(stream)} "
        f"({type(stream).__name__})"
    )


class PoolRouting:
    """torch's hooks for a pool whose segments come from an allocator of ours: the pool
    (``torch.cuda.MemPool(allocator=...)``, 2.6+) and the private calls that route the
    caching allocator's allocations to it, the same ones ``torch.cuda.use_mem_pool`` makes
    (``_cuda_beginAllocateCurrentThreadToPool``), plus the one that routes every thread's
    (``_cuda_beginAllocateToPool``: autograd's backward runs on threads of its own)."""

    def __init__(self) -> None:
        c = torch._C
        names = (
            "_cuda_beginAllocateToPool",
            "_cuda_beginAllocateCurrentThreadToPool",
            "_cuda_endAllocateToPool",
            "_cuda_releasePool",
        )
        missing = [n for n in names if not callable(getattr(c, n, None))]
        pool = getattr(torch.cuda, "MemPool", None)
        pluggable = getattr(torch.cuda.memory, "CUDAPluggableAllocator", None)
        if pool is None or pluggable is None or missing:
            lacking = missing + [
                n
                for n, v in (("torch.cuda.MemPool", pool), ("CUDAPluggableAllocator", pluggable))
                if v is None
            ]
            raise LookupError(
                f"torch {torch.__version__} lacks {', '.join(lacking)} (a pool with an "
                "allocator of its own needs torch 2.6 or newer, built with CUDA)"
            )
        self.pool_class = pool
        self.pluggable = pluggable
        self.begin_all = c._cuda_beginAllocateToPool
        self.begin_thread = c._cuda_beginAllocateCurrentThreadToPool
        self.end = c._cuda_endAllocateToPool
        self.release = c._cuda_releasePool


def pool_live_ranges(pool: Any) -> list[tuple[int, int]] | None:
    """(address, size) of every allocated block in the segments of ``pool`` (a
    ``torch.cuda.MemPool``), from its own snapshot; None when it cannot be read (then a
    caller copies whole segments)."""
    try:
        try:  # 2.10+: no trace entries (they are not read here, and cost time)
            segments = pool.snapshot(include_traces=False)
        except TypeError:
            segments = pool.snapshot()
    except (RuntimeError, AttributeError):
        return None
    out: list[tuple[int, int]] = []
    for segment in segments:
        address = int(segment["address"])
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                out.append((int(block.get("address", address)), int(block["size"])))
            address += int(block["size"])
    return out


def autograd_nodes(roots: Iterable[Any]) -> Iterator[Any]:
    """Every node of the autograd graphs behind `roots` (``grad_fn`` objects, None skipped),
    each once, depth first.

    The walk holds every node's Python object until it ends: a C++ node's object lives only
    while something references it (torch 2.8 and 2.11 make a new one at each
    ``next_functions``), so a walk keyed by ids alone meets a node again under a new id, or
    takes a node for one seen whose dead object had the same id."""
    seen: dict[int, Any] = {}
    stack = [node for node in roots if node is not None]
    try:
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen[id(node)] = node
            yield node
            for child, _ in getattr(node, "next_functions", ()):
                if child is not None:
                    stack.append(child)
    finally:
        seen.clear()
        stack.clear()


def saved_values(node: Any, attr: str) -> list[Any]:
    """What autograd node `node` saved under `attr` (a ``_saved_*`` name), flat, without
    running a saved-tensors unpack hook where this torch lets one avoid it.

    Reading ``node._saved_x`` unpacks. Under saved-tensors hooks (``save_on_cpu``,
    offloading, compression) that runs the user's unpack hook, which may copy the tensor
    back to the device (in an OOM handler, of all moments) and makes a temporary whose
    address the next one can take. Where the raw saved tensors say their hook and hold
    their packed data (``_raw_saved_x``'s ``unpack_hook`` and ``data``: torch 2.15 has
    them, 2.8 does not), each is read as its data: a plain one's tensor, a hooked one's
    packed value (its tensors wherever the pack hook put them). Elsewhere the attribute
    is read as it always was. Raises what reading raises."""
    raw: Any = getattr(node, "_raw" + attr, None)
    raws: list[Any] = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    if raw is None or not all(hasattr(r, "unpack_hook") and hasattr(r, "data") for r in raws):
        value = getattr(node, attr)
        return list(value) if isinstance(value, (list, tuple)) else [value]
    values: list[Any] = []
    for r in raws:
        values.extend(tree_flatten(r.data)[0])
    return values
