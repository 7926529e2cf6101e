"""Courtesy regions: GPU memory that a pause gives back to the device while every address
stays, so that tensors, views, CUDA graphs and pointers held by C++ all work after resume.

``with Courtesy.region("train"):`` makes the caching allocator's segments for what is
allocated inside (on every thread: autograd's backward too) come from a pool whose
allocator is the Rust core (``src/courtesy/region.rs``): it creates physical memory with
the CUDA driver and maps it at a virtual range it reserved. ``Courtesy.pause("train")``
copies the live blocks of those segments to pinned host memory (or drops them for a
region marked disposable), unmaps the physical memory and releases it; the virtual ranges
stay reserved. ``Courtesy.resume("train")`` maps new physical memory at the same ranges and
copies the contents back.

Why a ``torch.cuda.MemPool`` with a pluggable allocator: it is torch's supported way to
give one pool's segments an allocator of their own while the caching allocator keeps
working for everything else (its statistics, snapshots and history stay whole, unlike
``change_current_allocator``, which must come before any allocation and replaces it for
the whole process). Its Python face exists from torch 2.6; the private routing calls are the
ones ``torch.cuda.use_mem_pool`` makes (``_torch.PoolRouting``). A torch without them gets
``CourtesyRegionUnavailable`` naming what is missing, as does a process without CUDA.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import torch

from .. import _core, _torch
from .._args import shown
from .reports import CourtesyRegionError, RegionReport

_courtesy = _core.courtesy


class CourtesyRegionUnavailable(RuntimeError):
    """This process cannot have a Courtesy region: no CUDA device, a torch without the pool
    hooks, or the allocator's expandable segments. The message says which and what to do."""


_lock = threading.RLock()
_regions: dict[str, Region] = {}
_allocators: dict[int, Any] = {}  # slot -> torch's pluggable allocator (kept for good)
_routing: _torch.PoolRouting | None = None
_retired: list[Any] = []  # pools of closed regions that a CUDA graph still holds


def _available() -> _torch.PoolRouting:
    global _routing
    if _routing is not None:
        return _routing
    if not torch.cuda.is_available():
        raise CourtesyRegionUnavailable(
            "Courtesy.region needs a CUDA device and torch sees none; without one there is "
            "no GPU memory to give back (Courtesy().yield_memory() is a no-op here too)"
        )
    try:
        routing = _torch.PoolRouting()
    except LookupError as error:
        raise CourtesyRegionUnavailable(
            f"Courtesy.region: {error}; upgrade torch, or use Courtesy().yield_memory(), "
            "which moves tensors instead"
        ) from None
    if "expandable_segments:true" in _torch.allocator_settings().replace(" ", "").lower():
        raise CourtesyRegionUnavailable(
            "Courtesy.region: the caching allocator runs with expandable_segments:True, whose "
            "segments grow in place and are not handed to a pool's allocator; unset it in "
            "PYTORCH_CUDA_ALLOC_CONF to use regions"
        )
    _routing = routing
    return routing


def _allocator(slot: int) -> Any:
    """The pluggable allocator of ``slot``: this library's allocation function of that slot.
    Kept for the life of the process: torch's pool holds only a raw pointer to it, and a
    segment freed late (a tensor that outlives its region) must still find it."""
    if slot not in _allocators:
        routing = _available()
        _allocators[slot] = routing.pluggable(
            _core.__file__, f"{_courtesy.REGION_MALLOC_PREFIX}{slot}", _courtesy.REGION_FREE
        )
    return _allocators[slot]


def _check_tag(tag: Any) -> str:
    if not isinstance(tag, str) or not tag:
        raise TypeError(f"tag must be a non-empty str, got {shown(tag)}")
    return tag


class Region:
    """A named region of one GPU's memory (``Courtesy.region(tag)`` makes or finds it).

    Use it as a context manager (``with region:``; re-entered later, its allocations join
    the same region) or with ``start()``/``stop()`` around a whole program. While it is
    entered, what torch allocates on its device goes to it: on every thread by default
    (``threads="all"``: autograd's backward allocates gradients on threads of its own), or
    on the entering thread only (``threads="current"``, as ``torch.cuda.use_mem_pool``).
    Only one region routes a device at a time.

    Capture a CUDA graph into a region of its own, outside any ``with`` block:
    ``torch.cuda.graph(g, pool=graphs.pool_id)`` (checked: its memory pauses and the graph
    replays after resume). A capture made while a region routes allocations puts them in
    that region's pool, where the region's later allocations could reuse the blocks the
    graph freed during capture (its intermediates, which each replay rewrites).
    """

    def __init__(
        self,
        tag: str,
        device: torch.device,
        keep_contents: bool,
        prepare_host: bool,
        threads: str,
    ):
        self.tag = tag
        self.device = device
        self.keep_contents = keep_contents
        self.prepare_host = prepare_host
        self.threads = threads
        slot = _courtesy.region_slot(tag)
        if slot is None:
            raise RuntimeError(
                f"Courtesy.region({tag!r}): {_courtesy.REGION_SLOTS} regions are open "
                "already; close() one first"
            )
        self._slot = int(slot)
        _courtesy.region_configure(tag, keep_contents, prepare_host)
        with torch.cuda.device(device):
            self._pool: Any = _available().pool_class(allocator=_allocator(self._slot).allocator())
        self._depth = 0
        self._paused = False
        self._closed = False

    @property
    def pool_id(self) -> Any:
        """The pool's id, for ``torch.cuda.graph(g, pool=region.pool_id)``."""
        self._check_open()
        return self._pool.id

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"region {self.tag!r} is closed")

    # Routing ------------------------------------------------------------------------------

    def start(self) -> Region:
        """Route this device's allocations to the region until ``stop()``."""
        with _lock:
            self._check_open()
            if self._paused:
                raise RuntimeError(
                    f"region {self.tag!r} is paused: Courtesy.resume({self.tag!r}) before "
                    "allocating in it again"
                )
            if self._depth == 0:
                other = _router(self.device)
                if other is not None:
                    raise RuntimeError(
                        f"region {other.tag!r} routes {self.device}'s allocations now: one "
                        "region at a time per device (leave it first)"
                    )
                routing = _available()
                index = self.device.index
                if self.threads == "all":
                    routing.begin_all(index, self._pool.id)
                else:
                    routing.begin_thread(index, self._pool.id)
                if torch.cuda.is_current_stream_capturing():
                    graph = getattr(torch.cuda.CUDAGraph, "get_currently_capturing_graph", None)
                    if graph is not None:  # as use_mem_pool: the graph keeps the pool
                        graph()._retain_pool(self._pool)
            self._depth += 1
        return self

    def stop(self) -> None:
        """Stop routing allocations to the region (what is in it stays)."""
        with _lock:
            if self._depth == 0:
                return
            self._depth -= 1
            if self._depth == 0:
                routing = _available()
                routing.end(self.device.index, self._pool.id)
                routing.release(self.device.index, self._pool.id)

    def __enter__(self) -> Region:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    @property
    def routing(self) -> bool:
        return self._depth > 0

    # Pause and resume ---------------------------------------------------------------------

    def pause(self) -> RegionReport:
        return pause(self.tag)

    def resume(self) -> RegionReport:
        return resume(self.tag)

    def live_ranges(self) -> list[tuple[int, int]] | None:
        """(address, size) of the allocated blocks in the region's segments, from the
        pool's own snapshot; None when it cannot be read."""
        return _torch.pool_live_ranges(self._pool)

    def state(self) -> dict[str, int]:
        """Segments, mapped, paused and pinned host bytes of the region now."""
        for entry in _state():
            if entry["tag"] == self.tag:
                return {
                    k: entry[k] for k in ("segments", "mapped_bytes", "paused_bytes", "host_bytes")
                }
        return {"segments": 0, "mapped_bytes": 0, "paused_bytes": 0, "host_bytes": 0}

    def release_host_memory(self) -> int:
        """Free the region's pinned host buffers that hold nothing paused; the bytes freed
        (the next pause pins again)."""
        return int(_courtesy.region_release_host([self.tag]))

    def close(self) -> None:
        """End the region: it routes nothing any more, its pinned host buffers are freed,
        and its segments go back to the driver as soon as torch frees them: now for the
        free ones (this calls ``torch.cuda.empty_cache()``, which empties the rest of the
        cache too), later for those its live tensors hold (once they are gone, at the next
        ``empty_cache()``; their host buffers are freed with them). A paused region must be
        resumed first (its tensors would point at nothing)."""
        with _lock:
            if self._closed:
                return
            if self._depth:
                raise RuntimeError(f"region {self.tag!r} is entered: leave it before close()")
            if self._paused:
                raise RuntimeError(
                    f"region {self.tag!r} is paused: Courtesy.resume({self.tag!r}) before close()"
                )
            self._closed = True
            _regions.pop(self.tag, None)
            pool, self._pool = self._pool, None
            if pool.use_count() == 1:
                # Dropping the last reference frees the pool's free segments (through our
                # free function); later frees of its live blocks go with the next
                # torch.cuda.empty_cache().
                del pool
            else:  # a captured CUDA graph holds the pool: torch frees it with the graph
                _retired.append(pool)
            torch.cuda.empty_cache()
            _courtesy.region_release_host([self.tag])
            _courtesy.region_close(self.tag)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "paused" if self._paused else "live"
        return f"<memlab_rs Region {self.tag!r} on {self.device} ({state})>"


def _router(device: torch.device) -> Region | None:
    return next((r for r in _regions.values() if r.device == device and r.routing), None)


def region(
    tag: str = "default",
    *,
    device: Any = None,
    keep_contents: bool = True,
    prepare_host: bool = True,
    threads: str = "all",
) -> Region:
    """The Courtesy region named ``tag`` (made on first use): ``with
    Courtesy.region("train"):`` puts what torch allocates inside it (on every thread) in
    memory that ``Courtesy.pause("train")`` gives back to the device and
    ``Courtesy.resume("train")`` maps again at the same addresses, contents copied back.
    ``device``: a CUDA device (the current one by default). ``keep_contents=False`` marks
    the region disposable (a KV cache): a pause drops its contents instead of copying
    them, and after resume they are undefined.
    ``prepare_host`` pins each segment's host buffer in a background thread as the segment
    appears, so the first pause copies at the bus's speed (it holds pinned host memory the
    size of the region meanwhile); with False the first pause pins them itself.
    """
    tag = _check_tag(tag)
    for name, value in (("keep_contents", keep_contents), ("prepare_host", prepare_host)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {shown(value)}")
    if threads not in ("all", "current"):
        raise ValueError(f"threads must be 'all' or 'current', got {shown(threads)}")
    _available()
    dev = (
        torch.device("cuda", torch.cuda.current_device())
        if device is None
        else _torch.parse_device(device, "device")
    )
    if dev.type != "cuda":
        raise ValueError(f"device must be a CUDA device, got {shown(device)}")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    _torch.cuda_index_exists(dev.index, f"device={shown(device)}")
    with _lock:
        found = _regions.get(tag)
        if found is not None:
            if found.device != dev and device is not None:
                raise ValueError(
                    f"region {tag!r} is on {found.device}, not {dev}: one tag, one device "
                    "(name the other region differently)"
                )
            wanted = (keep_contents, prepare_host, threads)
            if (found.keep_contents, found.prepare_host, found.threads) != wanted:
                raise ValueError(
                    f"region {tag!r} exists with keep_contents={found.keep_contents}, "
                    f"prepare_host={found.prepare_host}, threads={found.threads!r}"
                )
            return found
        made = Region(tag, dev, keep_contents, prepare_host, threads)
        _regions[tag] = made
        return made


def _state() -> list[dict[str, Any]]:
    return list(json.loads(_courtesy.region_state()))


def _select(tag: Any) -> list[Region]:
    if tag is None:
        return list(_regions.values())
    tag = _check_tag(tag)
    if tag not in _regions:
        known = ", ".join(repr(t) for t in _regions) or "none"
        raise ValueError(f"no open Courtesy region {tag!r} (open regions: {known})")
    return [_regions[tag]]


def _device_used(index: int) -> int | None:
    try:
        free, total = torch.cuda.mem_get_info(index)
    except RuntimeError:
        return None
    return int(total - free)


def _remaining(report: RegionReport, devices: list[int], state: list[dict[str, Any]]) -> None:
    """Per device after the call: what is still on it, and why."""
    for index in devices:
        name = f"cuda:{index}"
        used = _device_used(index)
        report.device_used_after[name] = used
        mapped = sum(e["mapped_bytes"] for e in state if e["device"] == index)
        in_regions = sum(
            e["mapped_bytes"] + e["paused_bytes"] for e in state if e["device"] == index
        )
        outside = max(0, int(torch.cuda.memory_reserved(index)) - in_regions)
        rows = [
            ("regions still mapped (not paused, or not asked)", mapped),
            ("torch's caching allocator outside any region (reserved)", outside),
        ]
        if used is not None:
            rows.append(
                (
                    "the CUDA context, other libraries' memory and other processes",
                    max(0, used - mapped - outside),
                )
            )
        report.remaining[name] = [(what, int(n)) for what, n in rows]


def _finish(report_json: str, before: dict[str, int | None], regions: list[Region]) -> RegionReport:
    """The report of a pause or resume, with the device's view after it; each region's
    paused flag follows its segments."""
    report = RegionReport(**json.loads(report_json))
    report.device_used_before = before
    state = _state()
    _remaining(report, sorted({r.device.index for r in regions}), state)
    for r in regions:
        r._paused = any(e["tag"] == r.tag and e["paused_bytes"] for e in state)
    if report.error:
        raise CourtesyRegionError(str(report), report)
    return report


def pause(tag: str | None = None) -> RegionReport:
    """Give back the physical memory of region ``tag`` (every region if None): its live
    blocks are copied to pinned host memory (unless the region is disposable), then its
    segments are unmapped and released; their addresses stay reserved. Between pause and
    resume nothing may touch the region's tensors (a kernel reading them faults)."""
    with _lock:
        regions = [r for r in _select(tag) if not r.closed]
        for r in regions:
            if r.routing:
                raise RuntimeError(
                    f"region {r.tag!r} is entered (it routes allocations): leave its with "
                    "block, or stop() it, before pausing"
                )
        devices = sorted({r.device.index for r in regions})
        before = {f"cuda:{i}": _device_used(i) for i in devices}
        for index in devices:
            torch.cuda.synchronize(index)
        tags = [r.tag for r in regions]
        if not tags:
            return RegionReport(action="pause", tags=[] if tag is None else [tag])
        live: list[tuple[int, int]] = []
        for r in regions:
            ranges = r.live_ranges()
            if ranges is None:  # no snapshot: keep every byte of every segment
                ranges = [(a, n) for e in _state() if e["tag"] == r.tag for a, n in e["ranges"]]
            live.extend(ranges)
        return _finish(_courtesy.region_pause(tags, live), before, regions)


def resume(tag: str | None = None) -> RegionReport:
    """Map new physical memory at every paused segment of region ``tag`` (every region if
    None) and copy its contents back: every tensor, view, CUDA graph and pointer into it
    works again. If the device has no room for all of it, ``CourtesyRegionError`` says how
    much stays paused; call resume again when there is room."""
    with _lock:
        regions = [r for r in _select(tag) if not r.closed]
        devices = sorted({r.device.index for r in regions})
        before = {f"cuda:{i}": _device_used(i) for i in devices}
        tags = [r.tag for r in regions]
        if not tags:
            return RegionReport(action="resume", tags=[] if tag is None else [tag])
        return _finish(_courtesy.region_resume(tags), before, regions)
