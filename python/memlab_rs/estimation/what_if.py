"""The what-if plan (``memlab_rs.plan``): before training, the peak of one step over the
choices people make, each changed alone from a baseline: the batch size (or sequence
length: whatever ``make_inputs`` takes), the precision (a dtype, or autocast with a
GradScaler for fp16), activation checkpointing of the repeated blocks, the optimizer. For
each, the largest size that fits a budget (the card's memory by default), and which choice
saves the most. Each row is an ``estimate``; Rust makes the result (kind ``plan``), finds
the best choice and renders the table (``_core.estimate.plan_*``); ``plan_result`` is the
result's class. (The module is not named ``plan``: that is the public function.)"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .. import _args, _core, results
from . import _amp, _data_parallel, _kernel_probe
from ._fake_step import FakeStepError
from ._optimizer import OptimizerSpec
from .estimator import _check_step, _target, estimate
from .plan_result import MemoryPlan
from .search import largest_within

__all__ = ["DEFAULT_OPTIMIZERS", "PRECISIONS", "plan", "precision_settings"]

#: The precisions a plan takes, by name: ``estimate``'s ``dtype``, ``autocast`` and
#: ``grad_scaler`` for each ("as given": the model's own dtype, no autocast).
PRECISIONS: dict[str, dict[str, Any]] = {
    "as given": {},
    "fp32": {"dtype": torch.float32},
    "bf16": {"dtype": torch.bfloat16},
    "fp16": {"dtype": torch.float16},
    "amp-bf16": {"autocast": torch.bfloat16},
    "amp-fp16": {"autocast": torch.float16, "grad_scaler": True},
}


def _sgd_momentum(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=1e-2, momentum=0.9)


def _adamw_fused(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3, fused=True)


#: The optimizers a plan tries beside the baseline's when ``optimizers`` is not given.
DEFAULT_OPTIMIZERS: dict[str, OptimizerSpec] = {
    "SGD (momentum)": _sgd_momentum,
    "AdamW (fused)": _adamw_fused,
}


@dataclasses.dataclass(frozen=True)
class _Settings:
    size: int
    precision: str
    checkpointing: bool
    optimizer: str
    parallel: str | None = None


def plan(
    model: torch.nn.Module,
    make_inputs: Callable[[int], Any],
    size: int,
    budget: int | str | None = None,
    *,
    size_name: str = "batch size",
    make_targets: Callable[[int], Any] | None = None,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    optimizer: OptimizerSpec | None = torch.optim.AdamW,
    optimizer_kwargs: dict[str, Any] | None = None,
    precision: str = "as given",
    checkpointing: bool = False,
    device: str | torch.device = "cuda:0",
    sizes: Sequence[int] | None = None,
    precisions: Sequence[str] | None = None,
    optimizers: Mapping[str, OptimizerSpec] | None = None,
    try_checkpointing: bool = True,
    search: bool = True,
    limit: int = 1 << 16,
    world_size: int = 1,
    parallel: str | None = None,
    try_parallel: bool = True,
    measure_kernels: bool = True,
) -> MemoryPlan:
    """The peak of one training step over the choices people make, each changed alone from
    the baseline (`size`, `precision`, `checkpointing`, `optimizer`), as a table.

    - `make_inputs(n)` gives the inputs for size `n`: the batch size, or the sequence
      length (say so with ``size_name="sequence length"``); `make_targets(n)` the targets
      for `loss_fn(output, targets)`, if any. `optimizer` and `optimizer_kwargs` are
      ``estimate``'s (default: AdamW, lr 1e-3).
    - `budget`: the bytes a step may reserve (an int, or ``"80GiB"``); default: on a GPU,
      its free memory and what torch reserves now (what this process could have).
    - The choices tried: `sizes` (default: half and twice `size`), `precisions` (names of
      ``PRECISIONS``; default ``bf16`` and ``amp-bf16``), `optimizers` (name to a class or
      factory; default SGD with momentum and fused AdamW), and checkpointing flipped
      (`try_checkpointing`).
    - `search`: for each row with a budget, the largest size that fits it (at most
      `limit`: a search of about 2·log2 of the answer estimates per row).
    - `world_size` and `parallel` (``"ddp"`` or ``"fsdp2"``): every row is one rank's step
      (``estimate``'s), `size` and the budget per rank; with more than one rank the other
      mode is tried too (`try_parallel`).
    - `measure_kernels`: ``estimate``'s (the convolutions' workspaces measured on the
      device, by one worker process for the whole plan).

    A row whose estimate cannot be made (``FakeStepError``, a model without repeated blocks
    to checkpoint) says why instead of its figures.

    >>> import torch, memlab_rs
    >>> model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
    ...                             torch.nn.Linear(256, 256))
    >>> p = memlab_rs.plan(model, lambda n: torch.zeros(n, 256), 64, budget="4MiB",
    ...                    device="cpu", try_checkpointing=False)
    >>> [row["axis"] for row in p.rows]
    ['baseline', 'size', 'size', 'precision', 'precision', 'optimizer', 'optimizer']
    >>> p.baseline["largest_size"] > 64
    True
    """
    _check_step(model, optimizer, optimizer_kwargs, None)
    if loss_fn is not None:
        _args.function(loss_fn, "loss_fn", "a function of the output (and the targets)")
    _args.function(make_inputs, "make_inputs", "a function of the size")
    if make_targets is not None:
        _args.function(make_targets, "make_targets", "a function of the size")
    size = _args.count(size, "size", minimum=1, what="the baseline's size, an int")
    limit = _args.count(limit, "limit", minimum=1, what="the largest size to try, an int")
    if not isinstance(size_name, str) or not size_name.strip():
        raise TypeError(f"size_name must be a name such as 'batch size', got {size_name!r}")
    _precision_name(precision, "precision")
    for flag, name in ((checkpointing, "checkpointing"), (try_checkpointing, "try_checkpointing"),
                       (search, "search"), (try_parallel, "try_parallel"),
                       (measure_kernels, "measure_kernels")):  # fmt: skip
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {_args.shown(flag)}")
    _data_parallel.check(world_size, parallel)
    target = _target(device)
    tried_sizes = _sizes(size, sizes)
    tried_precisions = _precisions(precision, precisions)
    tried_optimizers = _optimizers(optimizers)
    budget_bytes, budget_source = _budget(budget, target)
    notes: list[str] = []
    if budget_bytes is None:
        notes.append("no budget: pass budget=<bytes> to see what fits")

    base_name = _optimizer_name(optimizer, optimizer_kwargs)
    base = _Settings(size, precision, checkpointing, base_name, parallel)
    specs: dict[str, tuple[OptimizerSpec | None, dict[str, Any] | None]] = {
        base_name: (optimizer, optimizer_kwargs)
    }
    wanted: list[tuple[str, _Settings]] = [("baseline", base)]
    wanted += [("size", dataclasses.replace(base, size=n)) for n in tried_sizes]
    wanted += [("precision", dataclasses.replace(base, precision=p)) for p in tried_precisions]
    if try_checkpointing:
        wanted.append(("checkpointing", dataclasses.replace(base, checkpointing=not checkpointing)))
    for name, spec in tried_optimizers.items():
        if name != base_name:
            specs[name] = (spec, None)
            wanted.append(("optimizer", dataclasses.replace(base, optimizer=name)))
    if world_size > 1 and try_parallel:
        for mode in _data_parallel.MODES:
            if mode != parallel:
                wanted.append(("parallel", dataclasses.replace(base, parallel=mode)))

    peaks: dict[_Settings, tuple[int, int] | str] = {}
    # What the rows' estimates say of the convolutions' workspaces (measured where, or not
    # counted and why): the table's figures depend on it, so the plan says it once.
    kernel_notes: dict[str, None] = {}

    def peak(settings: _Settings) -> tuple[int, int] | str:
        """(peak allocated, peak reserved) of the step with these settings, or why not."""
        if settings not in peaks:
            spec, kwargs = specs[settings.optimizer]
            try:
                est = estimate(
                    model,
                    make_inputs(settings.size),
                    optimizer=spec,
                    optimizer_kwargs=kwargs,
                    loss_fn=loss_fn,
                    device=target,
                    targets=make_targets(settings.size) if make_targets is not None else None,
                    checkpointing=settings.checkpointing,
                    world_size=world_size,
                    parallel=settings.parallel,
                    measure_kernels=measure_kernels,
                    **PRECISIONS[settings.precision],
                )
                peaks[settings] = (est.peak_allocated, est.peak_reserved)
                kernel_notes.update(dict.fromkeys(_kernel_probe.notes_of(est.notes)))
            except (FakeStepError, ValueError, NotImplementedError) as error:
                peaks[settings] = f"{type(error).__name__}: {error}"
        return peaks[settings]

    rows = []
    with _kernel_probe.held_open():  # one worker measures the kernels of every row
        for axis, settings in wanted:
            found = peak(settings)
            row: dict[str, Any] = {
                "axis": axis,
                "size": settings.size,
                "precision": _precision_label(settings.precision, model),
                "checkpointing": settings.checkpointing,
                "optimizer": settings.optimizer,
                "peak_allocated": None,
                "peak_reserved": None,
                "largest_size": None,
                "error": None,
                "parallel": settings.parallel,
            }
            if isinstance(found, str):
                row["error"] = found
            else:
                row["peak_allocated"], row["peak_reserved"] = found
                if search and budget_bytes is not None:

                    def need(
                        n: int, settings: _Settings = settings, budget: int = budget_bytes
                    ) -> int:
                        at = peak(dataclasses.replace(settings, size=n))
                        return budget + 1 if isinstance(at, str) else at[1]  # no estimate: no fit

                    row["largest_size"] = largest_within(
                        need, budget_bytes, limit, start=settings.size
                    )
            rows.append(row)
    notes.extend(kernel_notes)
    if target.type == "cuda":
        notes.append(
            "peaks of the caching allocator as modelled for the step (parameters, buffers and "
            "inputs on the device before it); the CUDA context and other processes' memory "
            "are not in them"
        )
    data = {
        "model": type(model).__name__,
        "device": str(target),
        "size_name": size_name.strip(),
        "budget": budget_bytes,
        "budget_source": budget_source,
        "limit": limit,
        "rows": rows,
        "notes": notes,
        "world_size": world_size,
    }
    completed = _core.estimate.plan_complete(json.dumps(data))
    return MemoryPlan._from_json(completed, results.run_meta(str(target)))


def _precision_name(name: Any, parameter: str) -> str:
    if not isinstance(name, str) or name not in PRECISIONS:
        known = ", ".join(repr(p) for p in PRECISIONS)
        raise ValueError(f"{parameter} must be one of {known}, got {_args.shown(name)}")
    return name


def _precision_label(name: str, model: torch.nn.Module) -> str:
    """The precision as the table shows it: the model's own dtype for "as given"."""
    if name != "as given":
        return name + (" + GradScaler" if PRECISIONS[name].get("grad_scaler") else "")
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    return f"as given ({str(dtype).replace('torch.', '')})" if dtype is not None else name


def precision_settings(label: str) -> dict[str, Any]:
    """``estimate``'s ``dtype``/``autocast``/``grad_scaler`` for a plan row's precision as
    the row shows it (``_precision_label``'s inverse: "as given (float32)", "bf16",
    "amp-fp16 + GradScaler")."""
    name = "as given" if label.startswith("as given") else label.removesuffix(" + GradScaler")
    return PRECISIONS[name]


def _sizes(size: int, sizes: Sequence[int] | None) -> list[int]:
    if sizes is None:
        return sorted({n for n in (size // 2, size * 2) if n >= 1 and n != size})
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
        raise TypeError(f"sizes must be a list of ints, got {_args.shown(sizes)}")
    checked = [
        _args.count(n, "sizes", minimum=1, what="a list of sizes, each an int") for n in sizes
    ]
    return [n for n in dict.fromkeys(checked) if n != size]


def _precisions(base: str, precisions: Sequence[str] | None) -> list[str]:
    if precisions is None:
        precisions = ("bf16", "amp-bf16")
    if isinstance(precisions, str) or not isinstance(precisions, Sequence):
        raise TypeError(
            f"precisions must be a list of names such as ['bf16', 'amp-bf16'], got "
            f"{_args.shown(precisions)}"
        )
    names = [_precision_name(p, "precisions") for p in precisions]
    for name in names:
        _amp.check(
            PRECISIONS[name].get("autocast"), PRECISIONS[name].get("grad_scaler", False), True
        )
    return [p for p in dict.fromkeys(names) if p != base]


def _optimizers(optimizers: Mapping[str, OptimizerSpec] | None) -> dict[str, Any]:
    if optimizers is None:
        return dict(DEFAULT_OPTIMIZERS)
    if not isinstance(optimizers, Mapping):
        raise TypeError(
            "optimizers must map a name to an optimizer class or a factory taking the "
            f"parameters, e.g. {{'SGD': torch.optim.SGD}}, got {_args.shown(optimizers)}"
        )
    for name, spec in optimizers.items():
        if (
            not isinstance(name, str)
            or not callable(spec)
            or isinstance(spec, torch.optim.Optimizer)
        ):
            raise TypeError(
                f"optimizers[{name!r}] must be an optimizer class or a factory taking the "
                "parameters (an instance is bound to one set of parameters: give its class)"
            )
    return dict(optimizers)


def _optimizer_name(optimizer: Any, kwargs: dict[str, Any] | None) -> str:
    if optimizer is None:
        return "none (forward and backward)"
    if isinstance(optimizer, torch.optim.Optimizer):
        return type(optimizer).__name__
    name = getattr(optimizer, "__name__", type(optimizer).__name__)
    flags = [k for k in ("fused", "foreach") if (kwargs or {}).get(k)]
    return name + (f" ({', '.join(flags)})" if flags else "")


def _budget(budget: int | str | None, target: torch.device) -> tuple[int | None, str]:
    if budget is not None:
        return _args.size(budget, "budget"), "given"
    if target.type == "cuda" and torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info(target)
        reserved = torch.cuda.memory_reserved(target)
        return int(free + reserved), f"{target}'s free memory and torch's reserved, now"
    return None, "none"
