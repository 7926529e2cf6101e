"""Running a training step on fake tensors and recording every storage's birth and death.

The estimate's collector (``estimator.py`` is its public side, ``src/estimate`` its analysis):

- the model is copied with every parameter and buffer replaced by a fake tensor
  (``FakeTensorMode``: shapes, dtypes and storages, no data), so the user's model is never
  touched and nothing is allocated;
- a ``TorchDispatchMode`` above the fake mode sees each aten op's outputs; a storage it has
  not seen is an allocation, and a weak reference to the storage (which torch keeps alive
  exactly as long as the storage) records its free;
- ``saved_tensors_hooks`` mark what autograd saves for backward (activations);
- for ``cuda`` the step runs on fake *meta* tensors (fake CUDA tensors cannot run backward
  without a GPU: the autograd engine asks the driver for a CUDA context), with what CUDA's
  dispatch does differently put back by ``_cuda_dispatch`` (autocast, the fused dropout,
  the SDPA kernel CUDA would pick), foreach optimizers, and the cuBLAS workspaces (per
  thread: forward and backward run on different threads). Tensors on any other device (the
  optimizer's CPU step counters) are not counted, as on CUDA.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from .._categories import CATEGORIES
from . import _cuda_blas, _cuda_layer_norm, _cuda_reduce, _cuda_softmax
from ._accumulation import Accumulation
from ._kernel_probe import PROBED_OPS, KernelProbe
from ._known_values import KnownValues

ALLOC, FREE, PHASE = 0, 1, 2
# The replay's categories: the shared ones, then those reported under "other" but kept apart:
# the workspaces fake tensors do not show (intermediates leave them out) and the inputs
# (``other`` even when autograd saves them, as _categories lists them).
# Then the collectives' buffers of data parallelism (DDP's gradient buckets, FSDP2's
# all-gather and reduce-scatter buffers), also reported under "other".
REPLAY_CATEGORIES = (*CATEGORIES, "workspace", "input", "collective")
_CAT = {name: i for i, name in enumerate(REPLAY_CATEGORIES)}

# cuBLAS ops: the first on a thread gives its handle a workspace from the caching allocator
# (CublasHandlePool.cpp: one per (handle, stream), handles are per thread, never freed).
_BLAS_OPS = {
    "aten.mm.default",
    "aten.addmm.default",
    "aten.bmm.default",
    "aten.baddbmm.default",
    "aten.addbmm.default",
    "aten.addmv.default",
    "aten.mv.default",
}


_INDEX_PUT = torch.ops.aten.index_put.default
_INDEX_PUT_INPLACE = torch.ops.aten.index_put_.default


class FakeStepError(RuntimeError):
    """The model cannot run on fake tensors (a data-dependent shape, an op without a fake
    kernel): no estimate rather than a wrong one."""


@dataclass
class Book:
    """The recorded sequence, in order: ``(op, id, bytes)`` per event."""

    device_type: str  # the device whose storages count: "cuda" (as meta here) or "cpu"
    events: list[tuple[int, int, int]] = field(default_factory=list)
    categories: list[int] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    phase_names: list[str] = field(default_factory=list)
    saved: set[int] = field(default_factory=set)
    live: dict[int, int] = field(default_factory=dict)  # StorageImpl address -> id
    alloc_at: dict[int, int] = field(default_factory=dict)  # id -> index of its alloc event
    refs: dict[int, weakref.ref] = field(default_factory=dict)
    phase: str = ""
    # Set when the step is over: what the fake copy frees afterwards (the model, the
    # optimizer and the inputs going out of scope) is not part of the step.
    sealed: bool = False

    def phase_begin(self, name: str) -> None:
        self.phase = name
        self.phase_names.append(name)
        self.events.append((PHASE, len(self.phase_names) - 1, 0))

    def counts(self, tensor: torch.Tensor) -> bool:
        device = tensor.device.type
        return device == ("meta" if self.device_type == "cuda" else self.device_type)

    def storage_id(self, tensor: torch.Tensor) -> int | None:
        storage = tensor.untyped_storage()
        return self.live.get(storage._cdata)

    def see(self, tensor: torch.Tensor, origin: str, category: str = "temporary") -> int | None:
        """Record `tensor`'s storage if it is new; returns its id."""
        if not isinstance(tensor, torch.Tensor) or not self.counts(tensor):
            return None
        storage = tensor.untyped_storage()
        key = storage._cdata
        known = self.live.get(key)
        if known is not None:
            return known
        ident = len(self.categories)
        self.categories.append(_CAT[category])
        self.origins.append(f"{origin} ({self.phase})")
        self.live[key] = ident
        self.alloc_at[ident] = len(self.events)
        self.events.append((ALLOC, ident, storage.nbytes()))
        self.refs[ident] = weakref.ref(storage, _freed(self, key, ident))
        return ident

    def uncount(self, tensor: torch.Tensor) -> None:
        """`tensor` lives elsewhere on the real device (a CPU scalar): it counts 0 bytes."""
        ident = self.storage_id(tensor)
        if ident is not None:
            self.events[self.alloc_at[ident]] = (ALLOC, ident, 0)

    def synthetic(self, nbytes: int, origin: str) -> None:
        """An allocation fake tensors do not show (a cuBLAS workspace): never freed."""
        ident = len(self.categories)
        self.categories.append(_CAT["workspace"])
        self.origins.append(f"{origin} ({self.phase})")
        self.events.append((ALLOC, ident, nbytes))

    def transient(self, sizes: list[int], origin: str) -> None:
        """Allocations a kernel makes and frees inside one op, which fake tensors do not
        show (a reduction's staging buffer): allocated in order, freed in reverse."""
        idents = []
        for nbytes in sizes:
            ident = len(self.categories)
            self.categories.append(_CAT["temporary"])
            self.origins.append(f"{origin} ({self.phase})")
            self.events.append((ALLOC, ident, nbytes))
            idents.append(ident)
        for ident in reversed(idents):
            self.events.append((FREE, ident, 0))

    def held(self, nbytes: int, origin: str, category: str) -> int:
        """An allocation no fake tensor stands for (a collective's buffer, FSDP2's unsharded
        parameters): live until ``release``; returns its id."""
        ident = len(self.categories)
        self.categories.append(_CAT[category])
        self.origins.append(f"{origin} ({self.phase})")
        self.events.append((ALLOC, ident, nbytes))
        return ident

    def release(self, ident: int) -> None:
        """The free of a ``held`` allocation."""
        self.events.append((FREE, ident, 0))

    def set_category(self, tensor: torch.Tensor, category: str) -> None:
        ident = self.storage_id(tensor) if isinstance(tensor, torch.Tensor) else None
        if ident is not None and _rank(category) < _rank(REPLAY_CATEGORIES[self.categories[ident]]):
            self.categories[ident] = _CAT[category]


# Precedence (``_categories``): parameter, buffer, (inputs), gradient, optimizer state,
# activation, other; temporary is what is left.
_PRECEDENCE = (
    "parameter",
    "buffer",
    "input",
    "gradient",
    "optimizer_state",
    "activation",
    "other",
)


def _rank(category: str) -> int:
    return _PRECEDENCE.index(category) if category in _PRECEDENCE else len(_PRECEDENCE)


def _freed(book: Book, key: int, ident: int) -> Callable[[Any], None]:
    def callback(_ref: Any) -> None:
        if book.sealed:
            return
        if book.live.get(key) == ident:
            del book.live[key]
        book.events.append((FREE, ident, 0))

    return callback


class _Recorder(TorchDispatchMode):
    """Sees every aten op's outputs (above the fake mode): new storages are allocations."""

    def __init__(
        self,
        book: Book,
        workspaces: dict[str, int] | None,
        below: Callable[[], Any] | None = None,
        known: KnownValues | None = None,
        gpu_shape: tuple[int, int] | None = None,
        probe: KernelProbe | None = None,
    ):
        super().__init__()
        self.book = book
        # The engine's gradient accumulations, done in place as a real step does them.
        self.accumulation = Accumulation()
        # Measures on the device the workspaces of kernels no rule here predicts.
        self.probe = probe
        self.probed_ops_seen = False
        # (SMs, threads per SM) of the GPU modelled: the reductions' scratch depends on it.
        self.gpu_shape = gpu_shape
        self.known = known
        self.workspaces = workspaces
        self.given: set[tuple[str, str]] = set()
        # A guard to hold while the fake mode runs the op (the CUDA dispatch's keys are
        # above autograd: the kernels' own calls must not see them).
        self.below = below

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _INDEX_PUT and self.book.phase.startswith("backward"):
            # Autograd's formula for indexing (FunctionsManual.cpp, index_backward) writes the
            # gradient into its zeros in place, except for tensor subclasses (fake ones
            # included), which get an out-of-place copy: run the real step's.
            func = _INDEX_PUT_INPLACE
        accumulated = self.accumulation.in_place(func, args, kwargs)
        if accumulated is not None:
            func, args = accumulated
        with self.below() if self.below is not None else contextlib.nullcontext():
            out = NotImplemented
            if self.known is not None:  # a host read of a value a real step would know
                out = self.known.answer(func, args, kwargs)
                for t in self.known.made:
                    self.book.see(t, f"{func} (indices of a boolean mask)")
                self.known.made.clear()
            if out is NotImplemented:
                out = _run_fake(func, args, kwargs)
                if self.known is not None:
                    self.known.follow(func, args, kwargs, out)
            elif func._schema.is_mutable:  # answered in place (x[mask] = v): its value too
                self.known.follow(func, args, kwargs, out)
        name = str(func)
        # Copies the CUDA kernel makes of strided inputs before its outputs (layer norm's
        # expect_contiguous): allocated first, freed when the op returns.
        copies = [
            self.book.held(nbytes, f"{name} contiguous copy of an input", "temporary")
            for nbytes in (
                _cuda_layer_norm.input_copies(name, args) if self.gpu_shape is not None else []
            )
        ]
        if name in PROBED_OPS:
            self.probed_ops_seen = True
            events = self.probe.events(name, args, kwargs) if self.probe is not None else None
            if events:
                self._replay_kernel(name, events, out)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.book.see(t, name)
        for ident in copies:
            self.book.release(ident)
        if self.gpu_shape is not None:
            for sizes, what in _kernel_scratch(name, args, kwargs, self.gpu_shape):
                self.book.transient(sizes, f"{name} {what}")
        if self.workspaces is not None and name in _BLAS_OPS:
            # Forward and the optimizer run on the caller's thread, backward on the
            # autograd engine's device thread: one handle (and workspace) each. Every BLAS
            # call sets the cuBLAS workspace; addmm with a bias goes through cuBLASLt,
            # which has its own.
            thread = "backward" if self.book.phase.startswith("backward") else "main"
            kinds = ("cuBLAS", "cuBLASLt") if name == "aten.addmm.default" else ("cuBLAS",)
            for kind in kinds:
                nbytes = self.workspaces.get(kind, 0)
                if nbytes and (thread, kind) not in self.given:
                    self.given.add((thread, kind))
                    self.book.synthetic(nbytes, f"{kind} workspace, {thread} thread")
        return out

    def _replay_kernel(self, name: str, events: list[list], out: Any) -> None:
        """The device's trace of op `name` (``_kernel_probe._events``) in the op's place:
        each output block is the op's output storage of that size (in the allocator's
        rounding), each scratch block an allocation of its own, freed where it was."""
        pending: dict[int, torch.Tensor] = {}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and self.book.counts(t):
                if self.book.storage_id(t) is None:
                    pending.setdefault(t.untyped_storage()._cdata, t)
        cuda = self.book.device_type == "cuda"
        scratch: dict[int, int] = {}
        for i, (kind, value) in enumerate(events):
            if kind == "o":
                for key, t in pending.items():
                    nbytes = t.untyped_storage().nbytes()
                    if (max(512, -(-nbytes // 512) * 512) if cuda else nbytes) == value:
                        self.book.see(pending.pop(key), name)
                        break
            elif kind == "a":
                scratch[i] = self.book.held(value, f"{name} workspace (measured)", "temporary")
            elif value in scratch:
                self.book.release(scratch.pop(value))


def _kernel_scratch(
    name: str, args: tuple, kwargs: dict, gpu_shape: tuple[int, int]
) -> list[tuple[list[int], str]]:
    """What the CUDA kernel of op `name` allocates and frees inside the op, which its fake
    kernel does not show: (bytes in allocation order, what they are), one entry per model
    that applies (a reduction's staging buffer, cuBLAS's operand copies, softmax backward's
    buffer)."""
    found = [
        (_cuda_reduce.staging(name, args, kwargs, *gpu_shape), "staging buffer"),
        (_cuda_blas.operand_copies(name, args), "operand copied for cuBLAS"),
        (_cuda_softmax.softmax_backward_scratch(name, args), "buffer"),
    ]
    return [(sizes, what) for sizes, what in found if sizes]


def _run_fake(func: Any, args: tuple, kwargs: dict) -> Any:
    """`func` on fake tensors; an op whose fake (meta) kernel refuses what it was given is a
    FakeStepError naming the op and saying why (torch's meta kernels are sometimes stricter
    than its CUDA kernels: ``_grouped_mm``'s takes bf16 only in torch 2.11)."""
    try:
        return func(*args, **kwargs)
    except RuntimeError as error:
        if isinstance(error, FakeStepError) or explain(error) is not None:
            raise  # data-dependent, or no fake kernel at all: the estimator says so itself
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise FakeStepError(
            f"the model cannot be estimated on fake tensors: op {func} refused its inputs "
            f"there ({first}); if a real step runs it, its fake kernel is stricter than the "
            "device's: estimate in a dtype or layout that kernel takes"
        ) from error


def fake_model(
    model: torch.nn.Module,
    mode: FakeTensorMode,
    device: torch.device,
    dtype,
    known: KnownValues | None = None,
):
    """A copy of `model` whose parameters and buffers are fake tensors on `device` (tied
    ones stay tied); the model itself is untouched and nothing of its data is copied, except
    the small buffers' values into `known` (position ids, masks: a step may read them)."""
    memo: dict[int, Any] = {}
    with mode:
        for p in model.parameters():
            if id(p) not in memo:
                memo[id(p)] = torch.nn.Parameter(
                    _fake_like(p, device, dtype), requires_grad=p.requires_grad
                )
        for b in model.buffers():
            if id(b) not in memo:
                memo[id(b)] = _fake_like(b, device, dtype)
                if known is not None:
                    known.remember(memo[id(b)], b)
    return copy.deepcopy(model, memo)


def apply_order(module: torch.nn.Module):
    """(tensor, category) in the order ``module.to(device)`` allocates them
    (``Module._apply``: children first, then the module's own parameters, then its
    buffers), each once."""
    for child in module.children():
        yield from apply_order(child)
    for p in module._parameters.values():
        if p is not None:
            yield p, "parameter"
    for b in module._buffers.values():
        if b is not None:
            yield b, "buffer"


def _fake_like(t: torch.Tensor, device: torch.device, dtype) -> torch.Tensor:
    target = dtype if dtype is not None and t.is_floating_point() else t.dtype
    return torch.empty_strided(tuple(t.shape), t.stride(), dtype=target, device=device)


def fake_inputs(
    value: Any, mode: FakeTensorMode, device: torch.device, dtype, known: KnownValues | None = None
) -> Any:
    """The inputs with every tensor replaced by a fake one on `device` (floating ones in
    `dtype` when given); the small ones' values go into `known`."""

    def convert(t):
        if not isinstance(t, torch.Tensor):
            return t
        with mode:
            fake = _fake_like(t.detach(), device, dtype).requires_grad_(t.requires_grad)
        if known is not None:
            known.remember(fake, t)
        return fake

    return tree_map(convert, value)


def output_tensors(output: Any) -> list[torch.Tensor]:
    """Tensors in a model's output (tensors, tuples, dicts, transformers' ModelOutput)."""
    if isinstance(output, Mapping):
        output = list(output.values())
    return [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]


def default_loss(output: Any) -> torch.Tensor:
    """The output's ``loss`` when it has one (transformers given labels), else the sum of
    the output (a tensor or the first tensor in it)."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, Mapping):
        loss = output.get("loss")
    if isinstance(loss, torch.Tensor):
        return loss
    tensors = output_tensors(output)
    if not tensors:
        raise TypeError("the model returned no tensor: pass loss_fn=... to make a loss")
    return tensors[0].sum()


def explain(error: BaseException) -> FakeStepError | None:
    """A FakeStepError naming the op, when `error` says fake tensors cannot run it."""
    from torch._subclasses import fake_tensor as ft

    func = getattr(error, "func", None)
    if isinstance(error, (ft.DynamicOutputShapeException, ft.DataDependentOutputException)):
        return FakeStepError(
            f"the model cannot be estimated on fake tensors: op {func} has an output whose "
            "shape or value depends on the data (e.g. nonzero, masked_select, .item()); "
            "make the shapes static or estimate the parts around it"
        )
    if isinstance(error, ft.UnsupportedOperatorException):
        return FakeStepError(
            f"the model cannot be estimated on fake tensors: op {func} has no fake (meta) "
            "kernel; register one with torch.library.register_fake"
        )
    text = str(error)
    if "fake impl or Meta kernel" in text or "Meta tensors" in text:
        op = text.split(":", 1)[0].strip()
        return FakeStepError(
            f"the model cannot be estimated on fake tensors: op {op} has no fake (meta) "
            f"kernel; register one with torch.library.register_fake ({text.splitlines()[0]})"
        )
    return None
