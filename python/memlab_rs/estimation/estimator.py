"""The memory of a training step, estimated without allocating it (and without a GPU).

``estimate`` runs one forward, backward and optimizer step on fake tensors (two steps when
there is an optimizer: the first creates its state), records every storage's allocation and
free (``_fake_step``), and replays that sequence through a model of the device's allocator
(``src/estimate``: the CUDA caching allocator's rounding, pools, segments and splitting, or
the CPU allocator's exact sizes). ``max_batch_size`` (``search``) searches the largest batch
that fits a budget over such estimates.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable
from typing import Any

import torch

from .. import _args, _core, _torch, results
from .._categories import CATEGORIES
from . import _amp, _cuda_reduce, _data_parallel, _kernel_probe
from ._cuda_dispatch import CudaDispatch
from ._fake_step import (
    REPLAY_CATEGORIES,
    Book,
    FakeStepError,
    _Recorder,
    apply_order,
    default_loss,
    explain,
    fake_inputs,
    fake_model,
    output_tensors,
)
from ._known_values import KnownValues, eager_libraries
from ._optimizer import OptimizerSpec, check_instance, make_optimizer
from .checkpointing import enable_checkpointing
from .result import MemoryEstimate

__all__ = ["FakeStepError", "estimate"]

# A host read or a shape that needs data the fake step does not have.
_DATA_DEPENDENT = (
    torch._subclasses.fake_tensor.DataDependentOutputException,
    torch._subclasses.fake_tensor.DynamicOutputShapeException,
)


def estimate(
    model: torch.nn.Module,
    example_inputs: Any,
    optimizer: OptimizerSpec | None = None,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    device: str | torch.device = "cuda:0",
    dtype: torch.dtype | None = None,
    *,
    targets: Any = None,
    optimizer_kwargs: dict[str, Any] | None = None,
    backward: bool = True,
    autocast: torch.dtype | None = None,
    grad_scaler: bool = False,
    checkpointing: bool = False,
    world_size: int = 1,
    parallel: str | None = None,
    measure_kernels: bool = True,
) -> MemoryEstimate:
    """Estimate the memory of one training step of `model` on `device`, allocating nothing
    on it (but for `measure_kernels`).

    - `example_inputs`: a tensor, a tuple of positional inputs, or a dict of keyword inputs
      (real, meta or fake tensors: only their shapes and dtypes are used).
    - `optimizer`: an optimizer class with `optimizer_kwargs` (``torch.optim.AdamW``,
      ``optimizer_kwargs={"lr": 1e-3}``), a factory taking the parameters
      (``lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)``), or an instance
      over `model`'s parameters (the same class is built on the fake copy with each param
      group's hyperparameters; one that has state starts the estimate with state). On
      ``cuda``, ``foreach`` left unset becomes True, CUDA's default.
    - `loss_fn(output)` or, with `targets`, `loss_fn(output, targets)`; default: the
      output's ``loss`` (transformers models given labels), else the output's sum.
    - `dtype`: cast floating parameters, buffers and inputs to it (as ``model.to(dtype)``).
    - `autocast`: ``torch.bfloat16`` or ``torch.float16`` runs forward and the loss in a
      ``torch.autocast`` region of that dtype (mixed precision); `grad_scaler`: scale the
      loss with a ``torch.amp.GradScaler`` (``scaler.scale(loss).backward();
      scaler.step(opt); scaler.update()``). A GradScaler without autocast is modelled too.
    - `checkpointing`: activation checkpointing of the model's repeated blocks, as
      transformers' ``gradient_checkpointing_enable`` or ``torch.utils.checkpoint`` around
      each block does it (``memlab_rs.estimation.checkpointing``), on the fake copy only.
    - `parallel` with `world_size`: one rank's memory under data parallelism, each rank
      given `example_inputs`: ``"ddp"`` (``DistributedDataParallel(model)``: its gradient
      buckets beside the gradients) or ``"fsdp2"`` (``fully_shard`` on each repeated block,
      then on the model: rank 0's shards of the parameters, gradients and optimizer state,
      the unsharded parameters of the units being run and the all-gather and reduce-scatter
      buffers), both with their default arguments (``estimation._data_parallel``).
    - `measure_kernels`: the convolutions' workspaces (cuDNN's, oneDNN's) are the library's
      choice on the machine, not a function of the shapes: each distinct convolution of the
      step runs for real in a separate process on `device` when this machine has it, and
      its allocations as the device's allocator traced them (outputs and workspace blocks,
      in order) stand in the fake op's place (``estimation._kernel_probe``). False: nothing
      runs, and those workspaces are not counted.

    The step is ``out = model(inputs); loss = loss_fn(out); loss.backward(); opt.step();
    opt.zero_grad(set_to_none=True)`` in a function: the output and the loss live until it
    returns. The model is never modified.

    >>> import torch
    >>> from memlab_rs import estimate
    >>> est = estimate(torch.nn.Linear(1000, 1000), torch.zeros(8, 1000),
    ...                optimizer=torch.optim.SGD, optimizer_kwargs={"lr": 0.1}, device="cpu")
    >>> est.parameters, est.gradients, est.peak_allocated
    (4004000, 4004000, 8072008)
    """
    started = time.perf_counter()
    _check_step(model, optimizer, optimizer_kwargs, loss_fn)
    if not isinstance(backward, bool):
        raise TypeError(f"backward must be True or False, got {_args.shown(backward)}")
    if not isinstance(checkpointing, bool):
        raise TypeError(f"checkpointing must be True or False, got {_args.shown(checkpointing)}")
    if not isinstance(measure_kernels, bool):
        raise TypeError(
            f"measure_kernels must be True or False, got {_args.shown(measure_kernels)}"
        )
    _amp.check(autocast, grad_scaler, backward)
    _data_parallel.check(world_size, parallel)
    target = _target(device)
    cuda = target.type == "cuda"
    notes: list[str] = []
    step = (model, example_inputs, targets, optimizer, optimizer_kwargs, loss_fn, dtype,
            checkpointing, (parallel, world_size))  # fmt: skip
    # First as the real step runs (libraries hear the tensors are not fake); if the step
    # reads a value nobody knows here (one computed from the weights), again with the
    # libraries told the truth, taking the path they take under tracing.
    recorded = None
    why_not = _kernel_probe.available(target) if measure_kernels else "measure_kernels=False"
    probe = _kernel_probe.KernelProbe(target) if why_not is None else None
    try:
        for eager in (True, False):
            notes.clear()
            with eager_libraries() if eager else contextlib.nullcontext(False) as told:
                try:
                    recorded = _record(*step, target, backward, autocast, grad_scaler, notes, probe)
                    break
                except _DATA_DEPENDENT as error:
                    if not told:
                        raise _unanswerable(error) from error
    finally:
        if probe is not None:
            probe.close()
    assert recorded is not None  # the second try returns or raises
    if not eager:
        notes.append(
            "the step reads a value computed from the weights: transformers ran its "
            "graph-safe path (as under torch.compile), which may differ from an eager step"
        )
    book, amp, steps, convolutions = recorded
    if cuda:
        autocasts = "autocast, " if autocast is not None else ""
        notes.append(
            f"CUDA emulated on fake meta tensors: {autocasts}fused dropout, SDPA kernel as "
            "on sm80+, cuDNN batch norm, fused RMSNorm, cuBLAS workspaces, sum and mean's "
            "staging buffers, cuBLAS's copies of operands it cannot read, softmax backward's "
            "buffer; other kernels' internal scratch not counted"
        )
    if probe is not None:
        notes.extend(probe.describe())
    elif convolutions:
        notes.append(_kernel_probe.unmeasured(target, str(why_not)))
    if grad_scaler:
        notes.append("GradScaler: gradients assumed finite (every step steps)")
    return _result(model, target, dtype, amp, book, steps, started, notes, world_size, parallel)


def _unanswerable(error: Exception) -> FakeStepError:
    reason = explain(error)
    assert reason is not None, error  # explain() names every _DATA_DEPENDENT error
    return reason


def _record(
    model, example_inputs, targets, optimizer, optimizer_kwargs, loss_fn, dtype,
    checkpointing, data_parallel, target, backward, autocast, grad_scaler, notes, probe,
):  # fmt: skip
    """The step on fake tensors, recorded: (book, amp, steps, whether it convolved)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cuda = target.type == "cuda"
    run_on = torch.device("meta") if cuda else torch.device("cpu")
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    book = Book("cuda" if cuda else "cpu")
    if probe is not None:
        probe.begin()
    known = KnownValues()
    book.phase_begin("setup")
    fmodel = fake_model(model, mode, run_on, dtype, known)
    if checkpointing:
        notes.append(f"activation checkpointing: {enable_checkpointing(fmodel)}")
    with mode:
        dp = _data_parallel.make(*data_parallel, book, fmodel, run_on)
    if dp is not None and dp.shards_parameters:
        dp.setup()  # fully_shard: the shards replace the parameters before anything else
    for t, category in apply_order(fmodel):
        book.see(t, category, category)
    if dp is not None and not dp.shards_parameters:
        dp.setup()  # DDP(model): the buckets, after the model is on the device
    if dp is not None:
        notes.append(dp.describe())
    inputs = fake_inputs(example_inputs, mode, run_on, dtype, known)
    fake_targets = fake_inputs(targets, mode, run_on, dtype, known)
    for t in output_tensors([inputs, fake_targets]):
        book.see(t, "input", "input")
    held_by = dp.parameter if dp is not None else (lambda p: p)
    params = [held_by(p) for p in fmodel.parameters() if p.requires_grad]

    def fake(t: torch.Tensor) -> torch.Tensor:  # a hyperparameter given as a tensor
        device = run_on if t.device.type in ("meta", target.type) else t.device
        return fake_inputs(t, mode, device, None)

    with mode:
        opt = make_optimizer(optimizer, optimizer_kwargs, model, fmodel, fake, cuda, notes, held_by)
    if opt is not None:
        for state in opt.state.values():  # an instance's state, made before the step
            for value in state.values():
                book.see(value, "optimizer_state", "optimizer_state")
    workspaces = _cublas_workspaces(target, notes) if cuda else None
    dispatch = CudaDispatch(book) if cuda else None
    recorder = _Recorder(
        book,
        workspaces,
        dispatch.exclude_below if dispatch else None,
        known,
        gpu_shape=_cuda_reduce.device_shape(target) if cuda else None,
        probe=probe,
    )
    steps = 2 if opt is not None and backward else 1
    if steps == 2 and dp is not None:
        steps += dp.extra_steps  # DDP on CUDA: the second step is a bound, the third steady
    with mode:
        amp = _amp.Amp(autocast, grad_scaler, dispatch, run_on)
    try:
        with mode, dispatch or contextlib.nullcontext(), recorder:
            for step in range(1, steps + 1):
                _step(
                    book, fmodel, inputs, fake_targets, loss_fn, opt, params, step, backward,
                    amp, dp, recorder.accumulation,
                )  # fmt: skip
    except _DATA_DEPENDENT:
        raise
    except Exception as error:
        reason = explain(error)
        if reason is not None:
            raise reason from error
        raise
    book.sealed = True  # before the fake model, optimizer and inputs go
    return book, amp, steps, recorder.probed_ops_seen


def _step(
    book, fmodel, inputs, targets, loss_fn, opt, params, step, backward, amp, dp, accumulation
) -> None:  # fmt: skip
    book.phase_begin(f"forward {step}")

    def pack(t: torch.Tensor) -> torch.Tensor:
        book.set_category(t, "activation")
        return t.detach()  # the tensor itself would make a cycle through its grad_fn

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp.region():
        if isinstance(inputs, dict):
            output = fmodel(**inputs)
        elif isinstance(inputs, (tuple, list)):
            output = fmodel(*inputs)
        else:
            output = fmodel(inputs)
        if loss_fn is None:
            loss = default_loss(output)
        elif targets is not None:
            loss = loss_fn(output, targets)
        else:
            loss = loss_fn(output)
    for t in [*output_tensors(output), loss]:
        book.set_category(t, "other")
    scaler = amp.scaler
    if backward:
        book.phase_begin(f"backward {step}")
        if scaler is not None:
            scaled = scaler.scale(loss)  # a temporary: `scaler.scale(loss).backward()`
            for t in amp.scaler_tensors():
                book.set_category(t, "other")
            with accumulation.watching(scaled):
                scaled.backward()
            del scaled
        else:
            with accumulation.watching(loss):
                loss.backward()
        if dp is not None:
            dp.after_backward()  # FSDP2's final callback, at the end of backward
        for p in params:
            if p.grad is not None:
                book.set_category(p.grad, "gradient")
    if opt is not None and backward:
        book.phase_begin(f"optimizer {step}")
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        for state in opt.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    book.set_category(value, "optimizer_state")
        opt.zero_grad(set_to_none=True)
    # The output and the loss live to the end of the step, as in
    # `out = model(x); loss = ...; loss.backward(); opt.step()`.
    del output, loss
    if dp is not None:
        dp.after_step()


def _cublas_workspaces(device: torch.device, notes: list[str]) -> dict[str, int]:
    """The workspaces cuBLAS takes from the caching allocator per handle and stream
    (aten/src/ATen/cuda/CublasHandlePool.cpp): ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE:COUNT``
    KiB pairs), by default 32 MiB on sm90 and ``:4096:2:16:8`` elsewhere; the cuBLASLt one
    ``CUBLASLT_WORKSPACE_SIZE`` KiB (default 1024), at most the cuBLAS one."""
    major, minor = 9, 0
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(device)
    else:
        notes.append("no GPU here: cuBLAS workspace sized for sm90 (H100)")
    default = 4096 * 8 * 1024 if (major, minor) == (9, 0) else 4096 * 1024 * 2 + 16 * 1024 * 8
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    pairs = re.findall(r":([0-9]+):([0-9]+)", config or "")
    cublas = sum(int(a) * 1024 * int(b) for a, b in pairs) if pairs else default
    try:
        lt = int(os.environ.get("CUBLASLT_WORKSPACE_SIZE", "1024")) * 1024
    except ValueError:
        lt = 1024 * 1024
    return {"cuBLAS": cublas, "cuBLASLt": min(lt, cublas)}


def _result(
    model, device, dtype, amp, book: Book, steps: int, started: float, notes, world_size,
    parallel,
) -> MemoryEstimate:  # fmt: skip
    names = book.phase_names
    r = replay(book)
    if r["unmatched_frees"]:
        notes.append(f"{r['unmatched_frees']} frees of unknown storages ignored")
    end = {n: dict(zip(REPLAY_CATEGORIES, v)) for n, v in zip(names, r["phase_end_by_category"])}
    peaks = dict(zip(names, r["phase_peaks"]))
    setup = end["setup"]
    start_fw = sum(setup.values())
    # Intermediates leave the cuBLAS workspaces out (they stay for the process's life).
    ws_fw = end["forward 1"]["workspace"]
    ws_bw = end.get("backward 1", end["forward 1"])["workspace"]
    after_fw = sum(end["forward 1"].values()) - ws_fw
    fw_bw = max(peaks["forward 1"] - ws_fw, peaks.get("backward 1", 0) - ws_bw)
    last = lambda prefix, cat: max(  # noqa: E731
        (v[cat] for n, v in end.items() if n.startswith(prefix)), default=0
    )
    peak_phase = names[r["peak_phase"]]
    workspaces = max(v["workspace"] for v in end.values())
    at_peak = dict(zip(REPLAY_CATEGORIES, r["peak_by_category"]))
    return MemoryEstimate(
        model=type(model).__name__,
        device=str(device),
        dtype=_dtype_name(dtype),
        parameters=setup["parameter"],
        buffers=setup["buffer"],
        inputs=setup["input"],
        gradients=last("backward", "gradient"),
        optimizer_state=last("optimizer", "optimizer_state"),
        activations=end["forward 1"]["activation"],
        intermediates_forward=after_fw - start_fw,
        intermediates_backward=fw_bw - start_fw,
        peak_allocated=r["peak_allocated"],
        peak_step=int(peak_phase.split()[-1]) if peak_phase != "setup" else 1,
        peak_phase=peak_phase,
        peak_by_category=_public(at_peak),
        phase_peaks=peaks,
        phase_ends={n: sum(v.values()) for n, v in end.items()},
        step_peaks=step_peaks_of(peaks, steps),
        peak_reserved=r["peak_reserved"],
        workspaces=workspaces,
        allocations=len(book.categories),
        seconds=time.perf_counter() - started,
        notes=notes,
        autocast=_dtype_name(amp.dtype),
        grad_scaler=amp.scaler is not None,
        world_size=world_size,
        parallel=parallel,
        collective_buffers=at_peak["collective"],
        meta=results.run_meta(str(device)),
    )


def replay(book: Book) -> dict[str, Any]:
    """`book`'s recording replayed through the allocator model of its device
    (``src/estimate``): the recording crosses once, and the replay's figures come back once."""
    recording = {
        "device_type": "cuda" if book.device_type == "cuda" else "cpu",
        "events": book.events,
        "categories": book.categories,
        "n_categories": len(REPLAY_CATEGORIES),
        "n_phases": len(book.phase_names),
    }
    result: dict[str, Any] = json.loads(
        _core.estimate.replay(json.dumps(recording, separators=(",", ":")))
    )
    return result


def step_peaks_of(phase_peaks: dict[str, int], steps: int) -> dict[int, int]:
    """The peak of each step 1..`steps`: the highest of its phases ("forward 2", ...)."""
    return {
        s: max(v for n, v in phase_peaks.items() if n.endswith(f" {s}"))
        for s in range(1, steps + 1)
    }


def _dtype_name(dtype: torch.dtype | None) -> str | None:
    return str(dtype).replace("torch.", "") if dtype is not None else None


def _public(by_category: dict[str, int]) -> dict[str, int]:
    """The shared categories: workspaces, inputs and collectives' buffers count under
    ``other``."""
    out = {c: by_category[c] for c in CATEGORIES}
    out["other"] += by_category["workspace"] + by_category["input"] + by_category["collective"]
    return out


def _check_step(model: Any, optimizer: Any, optimizer_kwargs: Any, loss_fn: Any) -> None:
    """The arguments that describe the step, checked before anything is built: a TypeError
    or ValueError naming the parameter."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module, got {_args.shown(model)} ({type(model).__name__})"
        )
    check_instance(optimizer, optimizer_kwargs)
    if optimizer_kwargs is not None:
        if not isinstance(optimizer_kwargs, dict):
            raise TypeError(
                "optimizer_kwargs must be a dict of the optimizer class's arguments "
                f"({{'lr': 1e-3}}) or None, got {_args.shown(optimizer_kwargs)}"
            )
        if optimizer is None:
            raise ValueError(
                "optimizer_kwargs are given but no optimizer: pass the class they go with, "
                "e.g. optimizer=torch.optim.AdamW"
            )
    if loss_fn is not None:
        _args.function(loss_fn, "loss_fn", "a function of the output (and the targets)")


def _target(device: str | torch.device) -> torch.device:
    """The device to model, parsed as every memlab_rs function parses one (no GPU needed);
    a clear error for a device whose allocator is not modelled."""
    target = torch.device(_torch.device_key(device))
    if target.type not in ("cuda", "cpu"):
        raise ValueError(f"device {target} is not modelled: estimate for 'cuda' or 'cpu'")
    return target
