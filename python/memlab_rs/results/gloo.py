"""Gather one byte string from every rank of a gloo group, leaving no buffer behind.

``torch.distributed.gather_object`` would do the exchange, but the uint8 tensors it
makes outlive the call: gloo's worker thread drops its reference to a finished work a
moment after ``wait()`` returns, and until then PyTorch keeps the tensor's Python object
alive (and visible to ``gc``). A tensor report taken right after ``gather_results`` then
showed the pickled result on one rank only (22,842 bytes on a loaded CI machine). Here
the buffers are ours, and once the collectives have finished their storage is released:
whatever gloo still holds for a moment is an empty tensor.
"""

from __future__ import annotations

from typing import Any


def gather_bytes(payload: bytes, dst: int, group: Any) -> list[bytes] | None:
    """Every rank's ``payload``, in group rank order, on global rank ``dst``; None on the
    others. A collective: every rank of ``group`` (None: the default group) calls it.
    ``gather_results`` is its user; tests/integration/test_merge_gloo.py runs it in a gloo
    world of one.
    """
    import numpy as np
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    size = torch.tensor([len(payload)], dtype=torch.long)
    sizes = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
    buffers = [size, *sizes]
    try:
        dist.all_gather(sizes, size, group=group)
        lengths = [int(s.item()) for s in sizes]
        longest = max(lengths)
        mine = torch.zeros(longest, dtype=torch.uint8)
        buffers.append(mine)
        mine.numpy()[: len(payload)] = np.frombuffer(payload, dtype=np.uint8)
        outputs = None
        if dist.get_rank() == dst:
            outputs = [torch.empty(longest, dtype=torch.uint8) for _ in range(world)]
            buffers += outputs
        dist.gather(mine, outputs, dst=dst, group=group)
        if outputs is None:
            return None
        return [out.numpy()[:n].tobytes() for out, n in zip(outputs, lengths)]
    finally:
        for buffer in buffers:  # an empty storage: what gloo still references holds no bytes
            buffer.set_(torch.empty(0, dtype=buffer.dtype).untyped_storage())
