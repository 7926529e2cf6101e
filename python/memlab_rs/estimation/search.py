"""The largest batch whose estimated training step fits a memory budget: an exponential
search from 1, then a binary search, over ``estimate``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _args
from . import _amp, _data_parallel, _kernel_probe
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
    world_size: int = 1,
    parallel: str | None = None,
    measure_kernels: bool = True,
) -> int:
    """The largest batch size whose estimated step fits `budget` (0 if none does), at most
    `limit`.

    `make_inputs(batch)` returns the example inputs for a batch, `make_targets(batch)` the
    targets `loss_fn(output, targets)` takes (if any). `budget`: bytes, or a size as every
    size memlab_rs takes (``"40GiB"``, ``"40 GB"``: ``parse_size``); it defaults to the
    device's free memory now (CUDA only: without a GPU give it). `measure`: ``"reserved"``
    (the modelled segments, what must fit) or ``"allocated"``. `autocast`,
    `grad_scaler`, `world_size`, `parallel` and `measure_kernels` are ``estimate``'s (the
    batch is per rank; one worker process measures the kernels for the whole search).
    Exponential search from 1, then an interpolation search (``largest_within``).

    >>> import torch
    >>> from memlab_rs import max_batch_size
    >>> max_batch_size(torch.nn.Linear(1000, 1000), lambda b: torch.zeros(b, 1000),
    ...                budget=20_000_000, device="cpu")
    1498
    """
    _check_step(model, optimizer, optimizer_kwargs, loss_fn)
    _data_parallel.check(world_size, parallel)
    _amp.check(autocast, grad_scaler, True)
    if not isinstance(measure_kernels, bool):
        raise TypeError(
            f"measure_kernels must be True or False, got {_args.shown(measure_kernels)}"
        )
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

    def need(batch: int) -> int:
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
            world_size=world_size,
            parallel=parallel,
            measure_kernels=measure_kernels,
        )
        return est.peak_reserved if measure == "reserved" else est.peak_allocated

    with _kernel_probe.held_open():
        return largest_within(need, budget, limit)


def _extrapolated(at: Callable[[int], int], a: int, b: int, budget: int) -> int:
    """A size a little past where the line through (a, at(a)) and (b, at(b)) meets the
    budget: most likely the first that does not fit (0 when the line does not rise)."""
    rise = at(b) - at(a)
    if rise <= 0:
        return 0
    crossing = b + (budget - at(b)) * (b - a) // rise
    return crossing + crossing // 16 + 1


def largest_within(need: Callable[[int], int], budget: int, limit: int, start: int = 1) -> int:
    """The largest n in 1..`limit` with ``need(n) <= budget`` (0 if none), for a `need`
    that does not fall as n grows (a step's peak against its batch size).

    It brackets the answer from `start`: up by doubling, or further where the line through
    the last two sizes reaches the budget (a little past it), or down to 1; then it
    interpolates between the bracket's ends. A peak grows about linearly with the batch,
    so the guesses land on or next to the answer and a few estimates find it where
    doubling and bisection take about 2 log2 of it. After a guess that does not halve the
    bracket, bisection finishes: a bend or a flat stretch in `need` costs at most one
    estimate more than doubling and bisection.

    >>> largest_within(lambda n: 1000 + 37 * n, 1_000_000, 1 << 16, start=8)
    27000
    >>> largest_within(lambda n: 10 * n, 5, 100), largest_within(lambda n: n, 100, 64)
    (0, 64)
    """
    start = min(max(start, 1), limit)
    seen: dict[int, int] = {}

    def at(n: int) -> int:
        if n not in seen:
            seen[n] = need(n)
        return seen[n]

    if at(start) <= budget:
        previous, low, high = None, start, start * 2
        while high <= limit and at(high) <= budget:
            previous, low = low, high
            high = max(low * 2, _extrapolated(at, previous, low, budget))
        if high > limit:
            if low == limit or at(limit) <= budget:
                return limit
            high = limit
    else:
        if start == 1 or at(1) > budget:
            return 0
        low, high = 1, start
    bisect_next = False
    while high - low > 1:
        if bisect_next:
            guess = (low + high) // 2
        else:
            rise = at(high) - at(low)
            step = (budget - at(low)) * (high - low) // rise if rise > 0 else (high - low) // 2
            guess = min(max(low + step, low + 1), high - 1)
        width = high - low
        if at(guess) <= budget:
            low = guess
        else:
            high = guess
        # A guess that did not halve the bracket: `need` is not near a line here (the
        # allocator's 2 MiB steps at small sizes are flat stretches), and more guesses from
        # it could cost up to twice bisection's count; bisection finishes.
        bisect_next = bisect_next or (high - low) * 2 > width
    return low
