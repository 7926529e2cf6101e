"""Where and when a result was made (``meta``): versions, host, process, rank, time, device;
and the line that names a rank in a job of several processes."""

from __future__ import annotations

import datetime
import os
import platform
import socket
import sys
from typing import Any

from .._interrupts import reraise_interrupt


def rank_info() -> dict[str, int]:
    """This process's rank, world size and local rank: torch.distributed's when a process
    group is initialised, else torchrun's environment (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``), else a single process (0, 1, 0).

    >>> rank_info()["world_size"] >= 1
    True
    """
    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1)
    local = _env_int("LOCAL_RANK", rank)
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
    except Exception as error:  # a broken or partial torch.distributed: the environment stands
        reraise_interrupt(error)
    return {"rank": rank, "world_size": world, "local_rank": local}


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def run_meta(device: str | None = None, **extra: Any) -> dict[str, Any]:
    """Where and when a result was made: versions, host, process, rank, time, device.

    >>> sorted(run_meta("cpu"))[:4]
    ['argv', 'created', 'device', 'host']
    """
    import torch

    from .. import __version__

    meta: dict[str, Any] = {
        "memlab_rs": __version__,
        "torch": torch.__version__.split("+")[0],
        "python": platform.python_version(),
        "platform": sys.platform,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "argv": list(sys.argv),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
    }
    meta.update(rank_info())
    meta.update(extra)
    return meta


def rank_heading(meta: dict[str, Any]) -> str | None:
    """The line that says which rank a result comes from, for a result made in a job of
    several processes (None for a single process): rank, world size, device and host.

    >>> rank_heading({"rank": 1, "world_size": 2, "device": "cuda:1", "host": "node7"})
    'rank 1 of 2 (cuda:1 on node7)'
    >>> rank_heading({"rank": 0, "world_size": 1}) is None
    True
    """
    world = meta.get("world_size")
    if not isinstance(world, int) or world <= 1:
        return None
    where = [str(meta[k]) for k in ("device", "host") if meta.get(k)]
    suffix = f" ({' on '.join(where)})" if where else ""
    return f"rank {meta.get('rank')} of {world}{suffix}"
