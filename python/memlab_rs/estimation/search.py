"""The largest batch whose estimated training step fits a memory budget: an exponential
search from 1, then a binary search, over ``estimate``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _args
from . import _amp
from .estimator import OptimizerSpec, _check_step, _target, estimate


def max_batch_size(
    model: torch.nn.Module,
    make_inputs: Callable[[int], Any],
    budget: int | str | None = None,
    *,
    make_targets: Callable[[int], Any] | None = None,
    optimizer: OptimizerSpec | None = None,
    optimizer_kwargs: dict[str, Any] | None = None,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    device: str | torch.device = "cuda:0",
    dtype: torch.dtype | None = None,
    measure: str = "reserved",
    limit: int = 1 << 16,
    autocast: torch.dtype | None = None,
    grad_scaler: bool = False,
) -> int:
    """The largest batch size whose estimated step fits `budget` (0 if none does), at most
    `limit`.

    `make_inputs(batch)` returns the example inputs for a batch, `make_targets(batch)` the
    targets `loss_fn(output, targets)` takes (if any). `budget`: bytes, or a size as every
    size memlab_rs takes (``"40GiB"``, ``"40 GB"``: ``parse_size``); it defaults to the
    device's free memory now (CUDA only: without a GPU give it). `measure`: ``"reserved"``
    (the modelled segments, what must fit) or ``"allocated"``. `autocast` and
    `grad_scaler` are ``estimate``'s. Exponential search from 1, then binary search.

    >>> import torch
    >>> from memlab_rs import max_batch_size
    >>> max_batch_size(torch.nn.Linear(1000, 1000), lambda b: torch.zeros(b, 1000),
    ...                budget=20_000_000, device="cpu")
    1498
    """
    _check_step(model, optimizer, optimizer_kwargs, loss_fn)
    _amp.check(autocast, grad_scaler, True)
    _args.function(make_inputs, "make_inputs", "a function of the batch size")
    if make_targets is not None:
        _args.function(make_targets, "make_targets", "a function of the batch size")
    limit = _args.count(limit, "limit", minimum=1, what="the largest batch size to try, an int")
    target = _target(device)
    if measure not in ("reserved", "allocated"):
        raise ValueError("measure must be 'reserved' or 'allocated'")
    if budget is not None:
        budget = _args.size(budget, "budget")
    else:
        if target.type != "cuda" or not torch.cuda.is_available():
            raise ValueError(
                "no budget given and no GPU to read free memory from: pass budget=<bytes>"
            )
        budget = torch.cuda.mem_get_info(target)[0]

    def fits(batch: int) -> bool:
        est = estimate(
            model,
            make_inputs(batch),
            optimizer=optimizer,
            optimizer_kwargs=optimizer_kwargs,
            loss_fn=loss_fn,
            device=target,
            dtype=dtype,
            targets=make_targets(batch) if make_targets is not None else None,
            autocast=autocast,
            grad_scaler=grad_scaler,
        )
        need = est.peak_reserved if measure == "reserved" else est.peak_allocated
        return need <= budget

    return largest_fitting(fits, limit)


def largest_fitting(fits: Callable[[int], bool], limit: int, start: int = 1) -> int:
    """The largest n in 1..`limit` with ``fits(n)`` (0 if none), for a `fits` that holds
    up to some n and not after: exponential search up from `start` (when it fits), else a
    binary search below it.

    >>> largest_fitting(lambda n: n <= 1000, 1 << 16, start=96)
    1000
    >>> largest_fitting(lambda n: n <= 5, 1 << 16, start=96), largest_fitting(lambda n: False, 8)
    (5, 0)
    """
    start = min(max(start, 1), limit)
    if fits(start):
        low, high = start, start * 2
        while high <= limit and fits(high):
            low, high = high, high * 2
        if high > limit:
            if low < limit and fits(limit):
                return limit
            high = limit
    else:
        if start == 1 or not fits(1):
            return 0
        low, high = 1, start
    while high - low > 1:
        mid = (low + high) // 2
        if fits(mid):
            low = mid
        else:
            high = mid
    return low
