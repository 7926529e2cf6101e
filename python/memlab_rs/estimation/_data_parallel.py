"""Data parallelism on the fake step: one rank's memory under DDP or FSDP2.

The fake step runs the rank's own forward, backward and optimizer step; this module adds
what the wrapper allocates around them, as the wrapper's own code does it, at the same
points of the step (module hooks, tensor hooks, an autograd function on the inputs):

- ``DDPRank`` (``torch.nn.parallel.DistributedDataParallel`` with its defaults): the
  reducer's gradient buckets, one flat tensor per bucket holding a copy of every trainable
  parameter's gradient (``gradient_as_bucket_view=False``), allocated when DDP is built and
  rebuilt in the order gradients arrived at the second step's forward; the buffers'
  broadcast (``broadcast_buffers=True``) flattens them into one tensor per dtype before
  each forward. On CUDA the first step's buckets can outlive the rebuild. ProcessGroupNCCL
  keeps the tensors of an async collective on its work's shelf
  (``stashed_for_allocator_safety_``) until ``work.wait()``, which DDP does not call (it
  waits on the work's future). The watchdog thread, which sweeps every 100 ms
  (``kWatchdogThreadSleepMillis``), hands a finished work's shelf to the process group,
  and the next collective called from the main thread empties it. When a sweep came
  between step 1's last all-reduce finishing and step 2's rebuild, the rebuild's own
  broadcast empties the shelf and the old buckets go before the new ones are made: one
  set. When none did (steps back to back), they stay until the first collective after
  the next sweep: through step 2's peak or not, and for a few steps when steps are
  shorter than a sweep. So on CUDA the estimate runs three steps: the second keeps the
  first step's buckets to its end (the bound, what a step must fit), the third has one
  set (the floor: every step once the shelf is emptied, and step 2 in a loop that pauses
  after its first step). On two H200s (``bench/results/parallel_check_ddp_h200x2.txt``),
  12 models: with a 0.25 s pause after step 1, steps 2 and 3 of both ranks within 0.21%
  of the floor; back to back, every later step within 1.5% of the bound or of the floor.
  On the CPU (gloo, or the fake group the tests use) the old buckets go at the rebuild
  and two steps are run.
- ``FSDP2Rank`` (``fully_shard`` on each repeated block, then on the model; default
  arguments, no mixed-precision policy): each parameter lives as its dim-0 shard (padded to
  ``ceil(rows / world_size)`` rows), and so do its gradient and the optimizer's state. A
  unit's forward all-gathers its parameters into one buffer, copies them out into the
  unsharded parameters and frees them after the forward (not the root's); backward gathers
  them again, prefetching the previous unit; when a unit's backward is done its gradients
  go into a reduce-scatter buffer and come out as the shards of one reduced tensor. The
  order of allocations and frees follows ``torch.distributed.fsdp._fully_shard``
  (``FSDPParamGroup.unshard / wait_for_unshard / post_backward``): the forward keeps the
  last all-gather buffer until the next copy-out, backward frees it at once; the last
  reduce-scatter input lives until the next unit's reduce-scatter or the end of backward.

The rank modelled is rank 0, the one with the largest shards. NCCL's own buffers are not in
the caching allocator and are not counted.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from .._args import shown
from ._fake_step import Book
from .checkpointing import repeated_blocks

MODES = ("ddp", "fsdp2")

# DDP's defaults (torch/nn/parallel/distributed.py, c10d/reducer.hpp).
_FIRST_BUCKET_BYTES = 1024 * 1024
_BUCKET_CAP_BYTES = 25 * 1024 * 1024
_BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024


def check(world_size: Any, parallel: Any) -> None:
    """A TypeError or ValueError naming the parameter, before anything is built."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise TypeError(f"world_size must be an int >= 1, got {shown(world_size)}")
    if parallel is not None and parallel not in MODES:
        raise ValueError(
            f"parallel must be None, 'ddp' or 'fsdp2' (fully_shard per repeated block), "
            f"got {shown(parallel)}"
        )
    if world_size > 1 and parallel is None:
        raise ValueError(
            f"world_size={world_size} needs a data-parallel mode: pass parallel='ddp' or "
            "parallel='fsdp2'"
        )


def make(
    parallel: str | None, world_size: int, book: Book, fmodel: nn.Module, run_on: torch.device
) -> DDPRank | FSDP2Rank | None:
    if parallel == "ddp":
        return DDPRank(book, fmodel, world_size, nccl=book.device_type == "cuda")
    if parallel == "fsdp2":
        return FSDP2Rank(book, fmodel, world_size, run_on)
    return None


@functools.cache
def _releases_before_copy_out() -> bool:
    """Whether this torch's FSDP2 frees the previous unit's all-gather buffer before the
    copy-out of the next: it does from the release that moved the free into
    ``FSDPCommContext.release_all_gather_state_for_comm_reuse``. Before, ``wait_for_unshard``
    bound the state to a local (``prev_all_gather_state``), which kept it to the return."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPCommContext
    except ImportError:  # no FSDP2 in this torch: the newest behaviour
        return True
    return hasattr(FSDPCommContext, "release_all_gather_state_for_comm_reuse")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class DDPRank:
    """One rank of ``DistributedDataParallel(model)`` with its defaults."""

    shards_parameters = False

    def __init__(self, book: Book, fmodel: nn.Module, world_size: int, nccl: bool):
        self.book = book
        self.world_size = world_size
        self.nccl = nccl
        # On CUDA a third step: the second holds two bucket sets (the bound: NCCL's shelf
        # still holds the first), the third one (the floor).
        self.extra_steps = 1 if nccl else 0
        trainable = list(dict.fromkeys(p for p in fmodel.parameters() if p.requires_grad))
        self.bucket_bytes = _bucket_sizes(trainable)
        self.parameters = len(trainable)
        self.buckets: list[int] = []
        self.retired: list[int] = []  # the first step's buckets, still held by its work
        self.forwards = 0
        # The buffers DDP broadcasts before each forward, grouped as take_tensors groups
        # them (by dtype, up to the broadcast bucket size): one flat tensor per group.
        self.broadcast: list[int] = _flat_groups(list(fmodel.buffers()))
        fmodel.register_forward_pre_hook(self._pre_forward)

    def setup(self) -> None:
        """The buckets, allocated when DDP is built."""
        self.buckets = [
            self.book.held(n, "DDP gradient bucket", "collective") for n in self.bucket_bytes
        ]

    def _pre_forward(self, module: nn.Module, args: Any) -> None:
        self.forwards += 1
        if self.forwards == 2 and torch.is_grad_enabled():
            # Reducer::rebuild_buckets: new buckets (the same parameters, in the order their
            # gradients came); the old ones go when the first step's work lets them go.
            # Rank 0 broadcasts the new assignment first: the bucket indices (one int32 per
            # parameter, and one) and the bucket sizes (one per bucket), each copied to the
            # device; on a CUDA device the host tensors are not its memory.
            indices, sizes = 4 * (self.parameters + 1), 4 * len(self.bucket_bytes)
            copies = [indices, sizes] if self.nccl else [indices, indices, sizes, sizes]
            self.book.transient(copies, "DDP bucket indices broadcast")
            self.retired = self.buckets
            if not self.nccl:
                self.after_step()
            self.buckets = [
                self.book.held(n, "DDP gradient bucket (rebuilt)", "collective")
                for n in self.bucket_bytes
            ]
        for nbytes in self.broadcast:
            self.book.transient([nbytes], "DDP buffer broadcast")

    def parameter(self, p: nn.Parameter) -> nn.Parameter:
        return p

    def after_backward(self) -> None:
        pass

    def after_step(self) -> None:
        for ident in self.retired:
            self.book.release(ident)
        self.retired = []

    def describe(self) -> str:
        total = sum(self.bucket_bytes)
        return (
            f"DDP, {self.world_size} ranks: parameters, gradients and optimizer state "
            f"replicated; {len(self.bucket_bytes)} gradient buckets ({total} bytes) beside "
            "the gradients (gradient_as_bucket_view=False), rebuilt at the second step"
            + (
                "; on CUDA NCCL holds step 1's buckets until its watchdog (a 100 ms sweep) "
                "has seen their all-reduces finish and another collective is called: step 2 "
                "counts both sets (the bound a step must fit), step 3 one (the floor, and "
                "step 2's peak in a loop that pauses after its first step)"
                if self.nccl
                else ""
            )
            + (", the buffers broadcast before each forward" if self.broadcast else "")
        )


def _bucket_sizes(params: Sequence[torch.Tensor]) -> list[int]:
    """The bytes of each gradient bucket: torch's own assignment (a 1 MiB first bucket, then
    25 MiB ones, by dtype) where it takes these tensors, else the same greedy rule."""
    limits = [_FIRST_BUCKET_BYTES, _BUCKET_CAP_BYTES]
    try:
        from torch.distributed import _compute_bucket_assignment_by_size

        indices, _ = _compute_bucket_assignment_by_size(
            list(reversed(params)), limits, [False] * len(params)
        )
        order = list(reversed(params))
        return [sum(_nbytes(order[i]) for i in bucket) for bucket in indices]
    except (ImportError, RuntimeError, TypeError):
        pass
    sizes: list[int] = []
    open_: dict[torch.dtype, tuple[int, int]] = {}  # dtype -> (bytes, limit index)
    for p in reversed(params):
        filled, limit = open_.get(p.dtype, (0, 0))
        filled += _nbytes(p)
        if filled >= limits[limit]:
            sizes.append(filled)
            open_[p.dtype] = (0, min(limit + 1, len(limits) - 1))
        else:
            open_[p.dtype] = (filled, limit)
    sizes.extend(filled for filled, _ in open_.values() if filled)
    return sizes


def _flat_groups(tensors: list[torch.Tensor]) -> list[int]:
    groups: list[int] = []
    current: dict[torch.dtype, int] = {}
    for t in tensors:
        n = _nbytes(t)
        if current.get(t.dtype, 0) + n > _BROADCAST_BUCKET_BYTES and current.get(t.dtype):
            groups.append(current.pop(t.dtype))
        current[t.dtype] = current.get(t.dtype, 0) + n
    groups.extend(n for n in current.values() if n)
    return groups


@dataclasses.dataclass(eq=False)
class _Unit:
    """One ``fully_shard`` call: its parameters and their shards, and where it is."""

    params: list[nn.Parameter]
    shards: list[nn.Parameter]
    root: bool
    state: str = "idle"  # idle, forward, pre_backward, post_backward
    unsharded: list[int] | None = None  # the held unsharded parameters
    pending: int | None = None  # an all-gather buffer not yet copied out
    post_forward_indices: list[int] = dataclasses.field(default_factory=list)


def _shard_shape(p: torch.Tensor, world_size: int) -> tuple[int, ...]:
    """Rank 0's shard (the largest, the padded size): torch.chunk's first chunk on dim 0."""
    shape = tuple(p.shape) or (1,)
    return (math.ceil(shape[0] / world_size), *shape[1:])


class FSDP2Rank:
    """Rank 0 of ``fully_shard`` on each repeated block of the model, then on the model."""

    shards_parameters = True
    extra_steps = 0

    def __init__(self, book: Book, fmodel: nn.Module, world_size: int, run_on: torch.device):
        self.book = book
        self.world_size = world_size
        self.run_on = run_on
        self.shard_of: dict[nn.Parameter, nn.Parameter] = {}
        blocks = repeated_blocks(fmodel)
        claimed: set[nn.Parameter] = set()
        self.units: list[_Unit] = []
        for module in [*blocks, fmodel]:
            params = [p for p in module.parameters() if p not in claimed]
            claimed.update(params)
            if not params:  # fully_shard makes no parameter group: nothing to gather
                continue
            shards = [self._shard(p) for p in params]
            unit = _Unit(params, shards, root=module is fmodel)
            self.units.append(unit)
            module.register_forward_pre_hook(self._pre_forward_hook(unit), with_kwargs=True)
            module.register_forward_hook(self._post_forward_hook(unit))
        # The root's state, with or without parameters, frees the forward's last all-gather
        # buffer once its forward is done (after its own group's post-forward).
        fmodel.register_forward_hook(self._root_post_forward)
        self.blocks = len(blocks)
        # What comm_ctx holds between units: the forward's last all-gather buffer, the last
        # reduce-scatter input, the order units finished their forwards.
        self.all_gather_state: int | None = None
        self.reduce_scatter_state: int | None = None
        self.post_forward_order: list[_Unit] = []

    def _shard(self, p: nn.Parameter) -> nn.Parameter:
        with torch.no_grad():
            shard = torch.empty(_shard_shape(p, self.world_size), dtype=p.dtype, device=p.device)
        shard = nn.Parameter(shard, requires_grad=p.requires_grad)
        self.shard_of[p] = shard
        return shard

    def setup(self) -> None:
        """The full parameters stand for the unsharded ones: they count nothing themselves
        (their memory is held while a unit is gathered); the shards are the parameters."""
        for unit in self.units:
            for p, shard in zip(unit.params, unit.shards):
                self.book.see(p, "parameter", "parameter")
                self.book.uncount(p)
                self.book.see(shard, "parameter (shard)", "parameter")

    def parameter(self, p: nn.Parameter) -> nn.Parameter:
        """What the optimizer holds for the fake model's parameter `p`: its shard."""
        return self.shard_of.get(p, p)

    # The unit's runtime, as FSDPParamGroup's.

    def _unshard(self, unit: _Unit) -> None:
        if unit.pending is not None or unit.unsharded is not None:
            return
        # Every rank's padded shards, one after the other.
        gathered = sum(_nbytes(s) for s in unit.shards) * self.world_size
        unit.pending = self.book.held(gathered, "FSDP2 all-gather buffer", "collective")

    def _wait_for_unshard(self, unit: _Unit) -> None:
        if unit.pending is None:
            return
        forward = unit.state == "forward"
        # The previous unit's buffer, kept for overlap, goes before the copy-out; torch
        # before 2.9 took it into a local of wait_for_unshard, which held it to the return.
        previous = self.all_gather_state if forward else None
        self.all_gather_state = None
        if previous is not None and _releases_before_copy_out():
            self.book.release(previous)
            previous = None
        unit.unsharded = [
            self.book.held(_nbytes(s) * self.world_size, "FSDP2 unsharded parameter", "parameter")
            for s in unit.shards
        ]
        if forward and self.world_size > 1:
            self.all_gather_state = unit.pending
        else:
            self.book.release(unit.pending)
        unit.pending = None
        if previous is not None:
            self.book.release(previous)

    def _reshard(self, unit: _Unit) -> None:
        for ident in unit.unsharded or ():
            self.book.release(ident)
        unit.unsharded = None

    def _pre_forward_hook(self, unit: _Unit) -> Callable[..., Any]:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> Any:
            if unit.state == "pre_backward":  # a recomputation (checkpointing) in backward
                return None
            entering = unit.state != "forward"
            unit.state = "forward"
            self._unshard(unit)
            self._wait_for_unshard(unit)
            if entering and torch.is_grad_enabled():
                return _after_backward_of_inputs(args, kwargs, lambda: self._post_backward(unit))
            return None

        return hook

    def _post_forward_hook(self, unit: _Unit) -> Callable[..., Any]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if unit.state == "pre_backward":
                return
            if not unit.root:  # the root is not resharded after forward
                self._reshard(unit)
            unit.post_forward_indices.append(len(self.post_forward_order))
            self.post_forward_order.append(unit)
            if torch.is_grad_enabled():
                for t in _grad_tensors(output):
                    t.register_hook(self._pre_backward_hook(unit))
            unit.state = "idle"

        return hook

    def _root_post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.all_gather_state is not None:
            self.book.release(self.all_gather_state)
            self.all_gather_state = None

    def _pre_backward_hook(self, unit: _Unit) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            if unit.state == "pre_backward":
                return
            unit.state = "pre_backward"
            self._unshard(unit)
            self._wait_for_unshard(unit)
            if unit.post_forward_indices:  # the default backward prefetch: one unit
                index = unit.post_forward_indices.pop()
                if index > 0:
                    self._unshard(self.post_forward_order[index - 1])

        return hook

    def _post_backward(self, unit: _Unit) -> None:
        unit.state = "post_backward"
        with_grad = [(p, s) for p, s in zip(unit.params, unit.shards) if p.grad is not None]
        first = with_grad[0][0].grad if with_grad else None
        self._reshard(unit)
        if self.reduce_scatter_state is not None:
            self.book.release(self.reduce_scatter_state)
            self.reduce_scatter_state = None
        if first is None:
            return
        dtype, itemsize = first.dtype, first.element_size()
        del first
        numel = sum(s.numel() for _, s in with_grad)
        rs_input = self.book.held(
            numel * self.world_size * itemsize, "FSDP2 reduce-scatter input", "collective"
        )
        for p, _ in with_grad:  # copied in: autograd's unsharded gradients go
            p.grad = None
        reduced = torch.empty(numel, dtype=dtype, device=self.run_on)
        offset = 0
        for _, shard in with_grad:
            shard.grad = reduced[offset : offset + shard.numel()].view(shard.shape)
            offset += shard.numel()
        self.reduce_scatter_state = rs_input

    def after_backward(self) -> None:
        """The root's final callback: post-backward of units whose inputs needed no grad
        (the root, usually), then the held buffers released and the order cleared."""
        root_first = sorted(self.units, key=lambda unit: not unit.root)  # as all_states
        for unit in root_first:
            if unit.state != "post_backward":
                self._post_backward(unit)
            unit.state = "idle"
        for unit in self.units:
            if unit.pending is not None:
                self.book.release(unit.pending)
                unit.pending = None
            unit.post_forward_indices.clear()
        for attr in ("all_gather_state", "reduce_scatter_state"):
            ident = getattr(self, attr)
            if ident is not None:
                self.book.release(ident)
                setattr(self, attr, None)
        self.post_forward_order.clear()

    def after_step(self) -> None:
        pass

    def describe(self) -> str:
        return (
            f"FSDP2, {self.world_size} ranks: fully_shard on {self.blocks} repeated blocks and "
            "the model; rank 0's shards of the parameters, gradients and optimizer state, the "
            "unsharded parameters and the all-gather and reduce-scatter buffers as "
            "fully_shard's defaults make them"
        )


def _grad_tensors(value: Any, found: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """The tensors needing grad in a module's output (tensors, sequences, mappings,
    dataclasses such as transformers' ModelOutput). A plain recursive function: a nested
    one that calls itself is a reference cycle, which would keep the list, and the tensors
    in it, alive until the garbage collector ran (moving their frees in the recording)."""
    if found is None:
        found = []
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            found.append(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            _grad_tensors(item, found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _grad_tensors(item, found)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _grad_tensors(getattr(value, f.name), found)
    return found


class _PostBackward(torch.autograd.Function):
    """FSDP2's RegisterPostBackwardFunction: the identity on a unit's inputs, whose backward
    runs once the unit's backward is done."""

    @staticmethod
    def forward(ctx: Any, callback: Callable[[], None], *inputs: torch.Tensor) -> Any:
        ctx.callback = callback
        return inputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        ctx.callback()
        return (None, *grads)


def _after_backward_of_inputs(
    args: tuple, kwargs: dict, callback: Callable[[], None]
) -> tuple[tuple, dict] | None:
    """`args` and `kwargs` with their tensors that need grad passed through ``_PostBackward``
    (FSDP2's _register_post_backward_hook), or None when none needs grad."""
    flat, spec = tree_flatten((args, kwargs))
    slots = [i for i, t in enumerate(flat) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not slots:
        return None
    outputs = _PostBackward.apply(callback, *(flat[i] for i in slots))
    for i, out in zip(slots, outputs):
        flat[i] = out
    return tree_unflatten(flat, spec)
