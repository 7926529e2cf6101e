"""Merging one result per rank into one, and gathering the ranks' results over gloo.

``merge_results`` checks what it is given (one kind, one job, distinct ranks), orders the
results by rank and hands them to the merge of their kind, which each room registers
(``register_merge``): line profiles merge line by line, tensor reports tensor by tensor.
``gather_results`` collects the ranks' results over a gloo (CPU) group instead of files, so
gathering never allocates on the GPU being profiled.
"""

from __future__ import annotations

import datetime
import os
import statistics
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Callable

from .. import _args
from . import files
from .gloo import gather_bytes

if TYPE_CHECKING:  # the kinds' merges return them; the rooms register them at import
    from ..merge import MergedLineProfile
    from ..tensor_report import MergedTensorReport

Value = Any  # an int, None where a rank has no value

#: kind -> its merge: (results ordered by rank, their ranks, the world size, the merged
#: result's meta) -> the merged result.
MERGERS: dict[str, Callable[[list[Any], list[int], int, dict[str, Any]], Any]] = {}


def register_merge(
    kind: str, merge: Callable[[list[Any], list[int], int, dict[str, Any]], Any]
) -> None:
    """Make ``merge_results`` merge results of ``kind`` with ``merge``."""
    MERGERS[kind] = merge


def merge_results(
    items: Iterable[Any], ranks: Sequence[int] | None = None
) -> MergedLineProfile | MergedTensorReport:
    """Merge one result per rank (result objects, or paths of saved result files) of one
    kind: line profiles into a ``MergedLineProfile``, tensor reports into a
    ``MergedTensorReport``.

    Each result's rank is read from its ``meta`` (``rank``, ``world_size``), as every tool
    records it; pass ``ranks`` to number them yourself. Two results of the same rank, of
    different kinds, or from jobs of different sizes are a ValueError naming them.

    >>> import torch, memlab_rs
    >>> held = [torch.zeros(256, 1024)]              # "rank 0" holds 1 MiB
    >>> a = memlab_rs.MemReporter().collect(device="cpu")
    >>> held.append(torch.zeros(256, 1024))          # "rank 1" holds 1 MiB more
    >>> b = memlab_rs.MemReporter().collect(device="cpu")
    >>> merged = merge_results([a, b], ranks=[0, 1])
    >>> total = merged.totals["cpu"]
    >>> total[1] - total[0]
    1048576
    """
    if isinstance(items, (str, bytes, os.PathLike, dict)) or not isinstance(items, Iterable):
        raise TypeError(
            "items must be a list of results (one per rank) or of their files, got "
            f"{_args.shown(items)} ({type(items).__name__}); a single file goes in a list"
        )
    loaded, names = [], []
    for item in items:
        if isinstance(item, (str, os.PathLike)):
            names.append(_args.path(item, "items"))
            loaded.append(files.load(item))
        else:
            loaded.append(files.check_result(item, f"items[{len(names)}]"))
            names.append(f"result {len(names) + 1}")
    if not loaded:
        raise ValueError(
            "merge_results: items is empty, no results to merge; give one result per rank"
        )
    kinds = {getattr(r, "kind", type(r).__name__) for r in loaded}
    if len(kinds) > 1:
        got = ", ".join(
            f"{n} ({getattr(r, 'kind', type(r).__name__)})" for n, r in zip(names, loaded)
        )
        raise ValueError(f"merge_results: results of one kind merge, got {got}")
    kind = kinds.pop()
    rank_list = _ranks(loaded, names, ranks)
    world = _world_size(loaded, names, rank_list)
    inputs = [_input_meta(r.meta, rank, name) for r, rank, name in zip(loaded, rank_list, names)]
    meta = _merged_meta(inputs, world)
    order = sorted(range(len(loaded)), key=lambda i: rank_list[i])
    loaded = [loaded[i] for i in order]
    rank_list = [rank_list[i] for i in order]
    if kind not in MERGERS:
        files._import_kinds()  # the rooms register their kinds' merges on import
    if kind not in MERGERS:
        merging = " and ".join(sorted(MERGERS)) or "none"
        raise ValueError(f"merge_results: {kind} results do not merge (these do: {merging})")
    return MERGERS[kind](loaded, rank_list, world, meta)


def gather_results(result: Any, dst: int = 0, group: Any = None) -> Any:
    """Gather every rank's ``result`` to rank ``dst`` over a gloo group (CPU memory only,
    so nothing is allocated on the GPU being profiled) and merge them there: the merged
    result on ``dst``, None on the other ranks.

    Every rank must call it, as any collective. ``group`` is a gloo process group; None
    makes one over all ranks (``torch.distributed.new_group(backend="gloo")``, itself a
    collective) when the default group is not gloo already.

    >>> import memlab_rs
    >>> gather_results(memlab_rs.LineProfiler().result())   # not in a process group
    Traceback (most recent call last):
    ...
    RuntimeError: gather_results needs torch.distributed initialised (init_process_group); ...
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "gather_results needs torch.distributed initialised (init_process_group); "
            "in a single process, save the result and merge the files instead"
        )
    made = None
    if group is None and dist.get_backend() != "gloo":
        group = made = dist.new_group(backend="gloo")
    payload = files.dumps(result).encode("utf-8")
    try:
        gathered = gather_bytes(payload, dst, group)
    finally:
        if made is not None:
            dist.destroy_process_group(made)
    if gathered is None:
        return None
    documents = [files.parse_json(raw, f"rank {i}") for i, raw in enumerate(gathered)]
    return merge_results([files.from_document(d, f"rank {i}") for i, d in enumerate(documents)])


def spread(values: Sequence[Value], ranks: Sequence[int]) -> dict[str, Any]:
    """min, median, max of the ranks' values (None: no value on that rank, left out) and
    ``max_rank``, the first rank holding the maximum; all None if no rank has a value.

    >>> spread([1, None, 5, 3], [0, 1, 2, 3])
    {'min': 1, 'median': 3, 'max': 5, 'max_rank': 2}
    """
    present = [(v, r) for v, r in zip(values, ranks) if v is not None]
    if not present:
        return {"min": None, "median": None, "max": None, "max_rank": None}
    numbers = [v for v, _ in present]
    top = max(numbers)
    median = statistics.median(numbers)
    if median == int(median):
        median = int(median)
    return {
        "min": min(numbers),
        "median": median,
        "max": top,
        "max_rank": next(r for v, r in present if v == top),
    }


def _ranks(loaded: list[Any], names: list[str], given: Sequence[int] | None) -> list[int]:
    if given is not None:
        ranks = [int(r) for r in given]
        if len(ranks) != len(loaded):
            raise ValueError(f"merge_results: {len(ranks)} ranks given for {len(loaded)} results")
    else:
        ranks = []
        for result, name in zip(loaded, names):
            rank = result.meta.get("rank")
            if not isinstance(rank, int):
                raise ValueError(
                    f'merge_results: {name} does not say which rank made it (no "rank" in '
                    "its meta); pass ranks=[...]"
                )
            ranks.append(rank)
    seen: dict[int, str] = {}
    for rank, name in zip(ranks, names):
        if rank in seen:
            raise ValueError(
                f"merge_results: {seen[rank]} and {name} are both rank {rank}; merge takes one "
                "result per rank (to compare two runs, use diff)"
            )
        seen[rank] = name
    return ranks


def _world_size(loaded: list[Any], names: list[str], ranks: list[int]) -> int:
    sizes = {r.meta.get("world_size") for r in loaded} - {None}
    if len(sizes) > 1:
        raise ValueError(
            "merge_results: the results come from jobs of different sizes (world sizes "
            f"{sorted(sizes)}): merge the results of one job"
        )
    world = sizes.pop() if sizes else len(loaded)
    return max(int(world), max(ranks) + 1)


def _input_meta(meta: dict[str, Any], rank: int, name: str) -> dict[str, Any]:
    keys = ("device", "host", "pid", "created", "local_rank", "argv")
    return {"rank": rank, "source": name, **{k: meta.get(k) for k in keys}}


def _merged_meta(inputs: list[dict[str, Any]], world: int) -> dict[str, Any]:
    from .. import __version__

    return {
        "memlab_rs": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "world_size": world,
        "ranks": sorted(i["rank"] for i in inputs),
        "inputs": sorted(inputs, key=lambda i: i["rank"]),
    }
