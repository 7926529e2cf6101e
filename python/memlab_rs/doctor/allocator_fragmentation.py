"""Fragmentation of torch's CUDA caching allocator: where the memory it reserved but no
tensor holds is (by pool, stream and segment; free blocks by size; the largest free block;
inactive split bytes), what the expandable-segments allocator would make of the same
blocks, and whether an allocation of a given size fits without growing the cache, with the
numbers behind the answer (kind ``fragmentation``).

The analysis is Rust's (``src/allocator/fragmentation``: torch's malloc path replayed on the
snapshot); this module reads the device (``_torch.cuda_allocator_state``) and wraps the
result. ``from_snapshot`` is the same analysis on a snapshot already held (the
post-mortem's, a saved one): a pure function.

>>> from memlab_rs.doctor.allocator_fragmentation import from_snapshot
>>> MiB = 1 << 20
>>> blocks = [{"size": 4 * MiB, "state": "active_allocated"}] * 5
>>> blocks += [{"size": 20 * MiB, "state": "inactive"}]
>>> blocks += [{"size": 4 * MiB, "state": "active_allocated"}] * 5
>>> blocks += [{"size": 20 * MiB, "state": "inactive"}]
>>> blocks += [{"size": 4 * MiB, "state": "active_allocated"}] * 5
>>> segment = {"address": 1 << 40, "total_size": 100 * MiB, "stream": 0,
...            "segment_type": "large", "blocks": blocks}
>>> result = from_snapshot([segment], request=30 * MiB, device_free_bytes=0)
>>> result.free_bytes, result.largest_free_block, result.inactive_split_bytes
(41943040, 20971520, 41943040)
>>> result.fits(), result.fragmented()
(False, True)
>>> result.fits("expandable_segments:True")
True
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from .. import _args, _core, results
from ..results.meta import run_meta


class _Rust:
    """The kind's Rust side (``_core.doctor``'s fragmentation functions) under the names
    ``results.Result`` calls: the doctor room hosts several kinds in one submodule."""

    validate = staticmethod(_core.doctor.fragmentation_validate)
    render = staticmethod(_core.doctor.fragmentation_render)


class FragmentationResult(results.Result):
    """One CUDA device's fragmentation, and optionally the verdict on one request.

    ``text()`` and ``html()`` show it; ``render("csv")`` lists the segments; ``to_data()``
    has every number (``pools``, ``segments``, ``free_sizes``, ``expandable``,
    ``request``)."""

    kind = "fragmentation"
    _rust = _Rust
    _formats: ClassVar[tuple[str, ...]] = ("text", "html", "json", "csv")

    @property
    def device(self) -> str:
        """``"cuda:N"``."""
        return str(self.to_data()["device"])

    @property
    def reserved_bytes(self) -> int:
        """Bytes the allocator holds in segments."""
        return int(self.to_data()["reserved_bytes"])

    @property
    def allocated_bytes(self) -> int:
        """Bytes in blocks tensors hold."""
        return int(self.to_data()["allocated_bytes"])

    @property
    def free_bytes(self) -> int:
        """Reserved bytes free for reuse (reserved - allocated - pending free)."""
        return int(self.to_data()["free_bytes"])

    @property
    def inactive_split_bytes(self) -> int:
        """Free bytes in segments split into several blocks: what ``empty_cache()`` cannot
        give back (torch's ``inactive_split_bytes``)."""
        return int(self.to_data()["inactive_split_bytes"])

    @property
    def largest_free_block(self) -> int:
        """The size of the largest free block (0 when there is none)."""
        largest = self.to_data()["largest_free"]
        return 0 if largest is None else int(largest["size"])

    @property
    def pools(self) -> list[dict[str, Any]]:
        """One dict per (pool, pool id, stream): reserved, allocated, free bytes, free
        blocks, the largest, inactive split bytes; most free bytes first."""
        return list(self.to_data()["pools"])

    @property
    def verdict(self) -> dict[str, Any] | None:
        """The request's verdict (None without a request): ``rounded_bytes``, ``pool``,
        ``free_bytes`` and ``largest_free`` of its pool and stream, ``fragmented``, and one
        scenario each ``configured``, ``expandable``, ``max_split`` (``setting``,
        ``outcome``, ``device_bytes``, ``released_bytes``, ``headroom_bytes``,
        ``estimate``)."""
        request = self.to_data()["request"]
        return None if request is None else dict(request)

    def _scenario(self, setting: str | None) -> dict[str, Any] | None:
        verdict = self.verdict
        if verdict is None:
            raise ValueError(
                "this result answers no request: call fragmentation(device, request=SIZE)"
            )
        if setting is None:
            return dict(verdict["configured"])
        key = setting.split(":")[0].strip()
        scenario = {"expandable_segments": verdict["expandable"],
                    "max_split_size_mb": verdict["max_split"]}.get(key)  # fmt: skip
        if key not in ("expandable_segments", "max_split_size_mb"):
            raise ValueError(
                f"setting={setting!r}: the scenarios are None (as configured), "
                "'expandable_segments:True' and 'max_split_size_mb'"
            )
        return None if scenario is None else dict(scenario)

    def fits(self, setting: str | None = None) -> bool | None:
        """Whether the request is met: as configured (``setting=None``), with
        ``"expandable_segments:True"`` or with ``"max_split_size_mb"`` (the value the
        analysis chose; see ``verdict``). None when the device's free memory would decide
        and is unknown, or when the analysis has no such scenario."""
        scenario = self._scenario(setting)
        if scenario is None:
            return None
        outcome = scenario["outcome"]
        if outcome == "needs_device_memory":
            return None
        return bool(outcome != "out_of_memory")

    def fits_without_growing(self) -> bool:
        """Whether a cached block holds the request as configured: the cache does not
        grow."""
        scenario = self._scenario(None)
        assert scenario is not None
        return bool(scenario["outcome"] == "reuses_cached_block")

    def fragmented(self) -> bool:
        """Whether the free bytes of the request's pool and stream would hold it but no
        single free block does."""
        verdict = self.verdict
        if verdict is None:
            raise ValueError(
                "this result answers no request: call fragmentation(device, request=SIZE)"
            )
        return bool(verdict["fragmented"])


def _analyse(state: dict[str, Any], meta: dict[str, Any]) -> FragmentationResult:
    data = _core.doctor.fragmentation_analyse(
        json.dumps(state, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    )
    return FragmentationResult._from_json(data, meta)


def _request(request: Any, stream: int, pool_id: Any) -> dict[str, Any] | None:
    if request is None:
        return None
    size = _args.size(request, "request")
    if size <= 0:
        raise ValueError(f"request must be a positive number of bytes, got {request!r}")
    pool = _pool_id(pool_id)
    return {"size": size, "stream": stream, "pool_id": pool}


def _pool_id(pool_id: Any) -> list[int]:
    if (
        isinstance(pool_id, (tuple, list))
        and len(pool_id) == 2
        and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in pool_id)
    ):
        return [int(pool_id[0]), int(pool_id[1])]
    raise TypeError(
        f"pool_id must be a pair of non-negative ints (a memory pool's id; (0, 0) for the "
        f"default pools), got {_args.shown(pool_id)}"
    )


def fragmentation(
    device: Any = None,
    *,
    request: int | str | None = None,
    stream: Any = None,
    pool_id: tuple[int, int] = (0, 0),
) -> FragmentationResult:
    """The fragmentation of CUDA ``device`` (None: the current one) now, and with
    ``request`` (bytes, or a size such as ``"30 MiB"``) whether an allocation of that size
    on ``stream`` (None: the current stream) in pool ``pool_id`` fits: as configured, with
    ``expandable_segments:True``, and with a ``max_split_size_mb`` the numbers suggest.

    Reads ``torch.cuda.memory_snapshot()``, ``memory_stats()`` and ``mem_get_info()``;
    changes nothing. Before CUDA is initialised the allocator holds nothing, and nothing
    initialises it here.

    >>> import memlab_rs
    >>> memlab_rs.fragmentation("cpu")
    Traceback (most recent call last):
    ...
    ValueError: device='cpu': fragmentation is the CUDA caching allocator's; give a CUDA device
    """
    from .. import _torch

    if device is None:
        index = _torch.local_cuda_index()
        _torch.cuda_index_exists(index, "device=None")
    else:
        dev = _torch.parse_device(device, "device")
        if dev.type != "cuda":
            raise ValueError(
                f"device={device!r}: fragmentation is the CUDA caching allocator's; "
                "give a CUDA device"
            )
        key = _torch.report_device(dev, "device")
        index = int(key[5:])
    state = _torch.cuda_allocator_state(index)
    stream_number = _torch.cuda_stream_number(stream, index)
    state["request"] = _request(request, stream_number, pool_id)
    return _analyse(state, run_meta(f"cuda:{index}"))


def from_snapshot(
    segments: list[dict[str, Any]],
    *,
    device: int = 0,
    request: int | str | None = None,
    stream: int = 0,
    pool_id: tuple[int, int] = (0, 0),
    allocator_conf: str = "",
    max_split_size: int | None = None,
    device_free_bytes: int | None = None,
    allowed_bytes: int | None = None,
    reported: dict[str, int | None] | None = None,
) -> FragmentationResult:
    """The same analysis on ``segments`` already held (``torch.cuda.memory_snapshot()``'s
    list, or ``_snapshot()["segments"]``; frames are ignored): a pure function of its
    arguments, for the post-mortem and for saved snapshots. ``device_free_bytes`` and
    ``allowed_bytes`` say what the device could still give (unknown when None);
    ``max_split_size`` is ``memory_stats()["max_split_size"]`` (-1: unlimited), which wins
    over ``allocator_conf``. A damaged snapshot is a ValueError naming the field."""
    if not isinstance(segments, list):
        raise TypeError(
            f"segments must be a list of snapshot segments (dicts), got {_args.shown(segments)}"
        )
    if not isinstance(stream, int) or isinstance(stream, bool) or stream < 0:
        raise TypeError(
            f"stream must be the snapshot's stream number (an int >= 0), got {stream!r}"
        )
    state: dict[str, Any] = {
        "device": device,
        "segments": segments,
        "allocator_conf": allocator_conf,
        "max_split_size": max_split_size,
        "reported": reported or {},
        "device_free_bytes": device_free_bytes,
        "allowed_bytes": allowed_bytes,
        "request": _request(request, stream, pool_id),
    }
    try:
        return _analyse(state, {"device": f"cuda:{device}"})
    except TypeError as error:  # json.dumps met a value that is no JSON
        raise TypeError(f"segments: {error}") from None


results.register(FragmentationResult.kind, FragmentationResult.from_data)
