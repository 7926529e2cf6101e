"""The memory of a training step, estimated without allocating it (and without a GPU).

``estimate`` runs one forward, backward and optimizer step on fake tensors (two steps when
there is an optimizer: the first creates its state), records every storage's allocation and
free (``_fake_step``), and replays that sequence through a model of the device's allocator
(``src/estimate``: the CUDA caching allocator's rounding, pools, segments and splitting, or
the CPU allocator's exact sizes). ``max_batch_size`` searches the largest batch that fits a
budget over such estimates.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import re
import time
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from . import _args, _core, _torch, results
from ._categories import CATEGORIES
from ._fake_step import (
    REPLAY_CATEGORIES,
    Book,
    FakeStepError,
    _CudaKernels,
    _Recorder,
    apply_order,
    default_loss,
    explain,
    fake_inputs,
    fake_model,
    output_tensors,
)

__all__ = ["FakeStepError", "MemoryEstimate", "estimate", "max_batch_size"]


@dataclasses.dataclass
class MemoryEstimate(results.SavedResult):
    """What one training step needs, in bytes (exact for the modelled allocator).

    ``peak_allocated`` predicts ``torch.cuda.max_memory_allocated()`` (or the CPU source's
    peak) of the step, starting from the parameters, buffers and inputs already on the
    device; ``peak_step`` says whether the first step (which creates the optimizer state) or
    the second, steady one peaks. Every figure is defined in docs/guide.md. ``save(path)``
    writes an ``estimate`` result file; ``memlab_rs.load`` reads it back, rendering the same.

    >>> import os, tempfile, torch, memlab_rs
    >>> est = memlab_rs.estimate(torch.nn.Linear(10, 10), torch.zeros(2, 10), device="cpu")
    >>> path = os.path.join(tempfile.mkdtemp(), "estimate.json")
    >>> est.save(path)
    >>> memlab_rs.load(path) == est
    True
    """

    kind: ClassVar[str] = "estimate"

    model: str
    device: str
    dtype: str | None
    parameters: int
    buffers: int
    inputs: int
    gradients: int
    optimizer_state: int
    activations: int
    intermediates_forward: int
    intermediates_backward: int
    peak_allocated: int
    peak_step: int
    peak_phase: str
    peak_by_category: dict[str, int]
    phase_peaks: dict[str, int]
    phase_ends: dict[str, int]
    step_peaks: dict[int, int]
    peak_reserved: int
    workspaces: int
    allocations: int
    seconds: float
    notes: list[str]
    #: Where and when it was made (``results.run_meta``; ``device``: the device modelled).
    meta: dict[str, Any] = dataclasses.field(
        default_factory=lambda: results.run_meta(None), compare=False, repr=False
    )

    @property
    def activations_at_peak(self) -> int:
        """Bytes autograd had saved for backward when the peak was reached."""
        return self.peak_by_category["activation"]

    def _lines(self) -> list[tuple[str, int, str]]:
        where = f"M (step {self.peak_step}, {self.peak_phase.split()[0]})"
        return [
            ("params", self.parameters, "M"),
            ("intermedite variables", self.intermediates_forward, " M (without backward)"),
            ("intermedite variables", self.intermediates_backward, " M (with backward)"),
            ("gradients", self.gradients, "M"),
            ("optimizer state", self.optimizer_state, "M"),
            ("activations saved for backward", self.activations, "M"),
            ("peak allocated", self.peak_allocated, where),
            ("peak reserved", self.peak_reserved, "M (modelled)"),
        ]

    def text(self) -> str:
        """The estimate in Pytorch-Memory-Utils' ``modelsize`` style (10^6-byte M).

        >>> import torch
        >>> from memlab_rs import estimate
        >>> est = estimate(torch.nn.Linear(1000, 1000), torch.zeros(8, 1000), device="cpu")
        >>> print(est.text().splitlines()[0])
        Model Linear : params: 4.004000M
        """
        notes = [*self.notes, f"on {self.device}; every figure is in docs/guide.md"]
        return _core._estimate_text(self.model, self._lines(), notes)

    def __str__(self) -> str:
        return self.text().rstrip("\n")  # print() adds the last newline

    def html(self) -> str:
        """The estimate as a self-contained HTML table (Jupyter shows it)."""
        return _core._estimate_html(self.model, self._lines(), self.notes)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready): every field and ``activations_at_peak``.

        >>> import torch
        >>> from memlab_rs import estimate
        >>> est = estimate(torch.nn.Linear(10, 10), torch.zeros(2, 10), device="cpu")
        >>> est.to_dict()["parameters"]
        440
        """
        data = self.to_data()
        data["activations_at_peak"] = self.activations_at_peak
        return data

    def to_json(self, indent: int | None = 2) -> str:
        """``to_dict()`` as JSON, ``indent`` spaces a level (None: one line)."""
        if indent is not None:
            indent = _args.count(indent, "indent", maximum=64, what="None or an int")
        return json.dumps(self.to_dict(), indent=indent)

    def to_data(self) -> dict[str, Any]:
        """The estimate as JSON values (a saved file's ``data``): every field but ``meta``,
        ``step_peaks`` keyed by the step's number as a string."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del data["meta"]
        data = copy.deepcopy(data)
        data["step_peaks"] = {str(k): v for k, v in self.step_peaks.items()}
        return data

    @classmethod
    def from_data(cls, data: dict[str, Any], meta: dict[str, Any]) -> MemoryEstimate:
        """The estimate from a saved file's ``data`` and ``meta`` (checked by ``load``
        against ``_result_schema.ESTIMATE``)."""
        names = [f.name for f in dataclasses.fields(cls) if f.name != "meta"]
        fields = {name: copy.deepcopy(data[name]) for name in names}
        fields["seconds"] = float(fields["seconds"])
        fields["step_peaks"] = {int(k): v for k, v in fields["step_peaks"].items()}
        return cls(**fields, meta=meta)


results.register("estimate", MemoryEstimate.from_data)

OptimizerSpec = Callable[..., torch.optim.Optimizer]


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
) -> MemoryEstimate:
    """Estimate the memory of one training step of `model` on `device`, allocating nothing.

    - `example_inputs`: a tensor, a tuple of positional inputs, or a dict of keyword inputs
      (real, meta or fake tensors: only their shapes and dtypes are used).
    - `optimizer`: an optimizer class with `optimizer_kwargs` (``torch.optim.AdamW``,
      ``optimizer_kwargs={"lr": 1e-3}``) or a factory taking the parameters
      (``lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)``). Not an instance:
      it is bound to the real parameters. On ``cuda``, ``foreach`` left unset becomes True,
      CUDA's default.
    - `loss_fn(output)` or, with `targets`, `loss_fn(output, targets)`; default: the
      output's ``loss`` (transformers models given labels), else the output's sum.
    - `dtype`: cast floating parameters, buffers and inputs to it (as ``model.to(dtype)``).

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
    target = _target(device)
    cuda = target.type == "cuda"
    if isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            "optimizer is an instance bound to the real parameters: pass its class with "
            "optimizer_kwargs (optimizer=torch.optim.AdamW, optimizer_kwargs={'lr': 1e-3}) "
            "or a factory (optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3))"
        )
    from torch._subclasses.fake_tensor import FakeTensorMode

    run_on = torch.device("meta") if cuda else torch.device("cpu")
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    book = Book("cuda" if cuda else "cpu")
    notes: list[str] = []
    book.phase_begin("setup")
    fmodel = fake_model(model, mode, run_on, dtype)
    for t, category in apply_order(fmodel):
        book.see(t, category, category)
    inputs = fake_inputs(example_inputs, mode, run_on, dtype)
    fake_targets = fake_inputs(targets, mode, run_on, dtype)
    for t in output_tensors([inputs, fake_targets]):
        book.see(t, "input", "input")
    params = [p for p in fmodel.parameters() if p.requires_grad]
    with mode:
        opt = _make_optimizer(optimizer, params, optimizer_kwargs, cuda, notes)
    workspaces = _cublas_workspaces(target, notes) if cuda else None
    recorder = _Recorder(book, workspaces)
    steps = 2 if opt is not None and backward else 1
    kernels = _CudaKernels(book) if cuda else contextlib.nullcontext()
    try:
        with mode, kernels, recorder:
            for step in range(1, steps + 1):
                _step(book, fmodel, inputs, fake_targets, loss_fn, opt, params, step, backward)
    except Exception as error:
        reason = explain(error)
        if reason is not None:
            raise reason from error
        raise
    if cuda:
        notes.append(
            "CUDA emulated on fake meta tensors: fused dropout, SDPA kernel as on sm80+, "
            "cuBLAS workspaces; cuDNN workspaces and kernels' internal scratch not counted"
        )
    return _result(model, target, dtype, book, steps, started, notes)


def _step(book, fmodel, inputs, targets, loss_fn, opt, params, step, backward) -> None:
    book.phase_begin(f"forward {step}")

    def pack(t: torch.Tensor) -> torch.Tensor:
        book.set_category(t, "activation")
        return t.detach()  # the tensor itself would make a cycle through its grad_fn

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
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
    if backward:
        book.phase_begin(f"backward {step}")
        loss.backward()
        for p in params:
            if p.grad is not None:
                book.set_category(p.grad, "gradient")
    if opt is not None and backward:
        book.phase_begin(f"optimizer {step}")
        opt.step()
        for state in opt.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    book.set_category(value, "optimizer_state")
        opt.zero_grad(set_to_none=True)
    # The output and the loss live to the end of the step, as in
    # `out = model(x); loss = ...; loss.backward(); opt.step()`.
    del output, loss


def _make_optimizer(spec, params, kwargs, cuda: bool, notes: list[str]):
    if spec is None:
        return None
    if isinstance(spec, type) and issubclass(spec, torch.optim.Optimizer):
        opt = spec(params, **(kwargs or {}))
    elif callable(spec):
        if kwargs:
            raise TypeError("optimizer_kwargs go with an optimizer class, not a factory")
        opt = spec(params)
    else:
        raise TypeError(
            f"optimizer must be an optimizer class or a factory taking the parameters, "
            f"not {type(spec).__name__}"
        )
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError("the optimizer factory must return a torch.optim.Optimizer")
    if cuda:
        for group in opt.param_groups:
            if "foreach" in group and group["foreach"] is None and not group.get("fused"):
                # CUDA's default (_default_to_fused_or_foreach): whole-list temporaries.
                group["foreach"] = True
    return opt


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


def _result(model, device, dtype, book: Book, steps: int, started: float, notes) -> MemoryEstimate:
    names = book.phase_names
    r = _core._estimate_replay(
        "cuda" if book.device_type == "cuda" else "cpu",
        book.events,
        book.categories,
        len(REPLAY_CATEGORIES),
        len(names),
    )
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
    step_peaks = {
        s: max(v for n, v in peaks.items() if n.endswith(f" {s}")) for s in range(1, steps + 1)
    }
    peak_phase = names[r["peak_phase"]]
    workspaces = max(v["workspace"] for v in end.values())
    return MemoryEstimate(
        model=type(model).__name__,
        device=str(device),
        dtype=str(dtype).replace("torch.", "") if dtype is not None else None,
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
        peak_by_category=_public(dict(zip(REPLAY_CATEGORIES, r["peak_by_category"]))),
        phase_peaks=peaks,
        phase_ends={n: sum(v.values()) for n, v in end.items()},
        step_peaks=step_peaks,
        peak_reserved=r["peak_reserved"],
        workspaces=workspaces,
        allocations=len(book.categories),
        seconds=time.perf_counter() - started,
        notes=notes,
        meta=results.run_meta(str(device)),
    )


def _public(by_category: dict[str, int]) -> dict[str, int]:
    """The shared categories: workspaces and inputs count under ``other``."""
    out = {c: by_category[c] for c in CATEGORIES}
    out["other"] += by_category["workspace"] + by_category["input"]
    return out


def _check_step(model: Any, optimizer: Any, optimizer_kwargs: Any, loss_fn: Any) -> None:
    """The arguments that describe the step, checked before anything is built: a TypeError
    or ValueError naming the parameter."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module, got {_args.shown(model)} ({type(model).__name__})"
        )
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
) -> int:
    """The largest batch size whose estimated step fits `budget` (0 if none does), at most
    `limit`.

    `make_inputs(batch)` returns the example inputs for a batch, `make_targets(batch)` the
    targets `loss_fn(output, targets)` takes (if any). `budget`: bytes, or a size as every
    size memlab_rs takes (``"40GiB"``, ``"40 GB"``: ``parse_size``); it defaults to the
    device's free memory now (CUDA only: without a GPU give it). `measure`: ``"reserved"``
    (the modelled segments, what must fit) or ``"allocated"``. Exponential search from 1,
    then binary search.

    >>> import torch
    >>> from memlab_rs import max_batch_size
    >>> max_batch_size(torch.nn.Linear(1000, 1000), lambda b: torch.zeros(b, 1000),
    ...                budget=20_000_000, device="cpu")
    1498
    """
    _check_step(model, optimizer, optimizer_kwargs, loss_fn)
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
        )
        need = est.peak_reserved if measure == "reserved" else est.peak_allocated
        return need <= budget

    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= limit and fits(high):
        low, high = high, high * 2
    if high > limit:
        return low
    while high - low > 1:
        mid = (low + high) // 2
        if fits(mid):
            low = mid
        else:
            high = mid
    return low
