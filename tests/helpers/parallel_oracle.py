"""The data-parallel oracle without GPUs: torch's own DDP and FSDP2 (``fully_shard``) run a
real training step on CPU tensors over a fake process group of `world_size` ranks (torch's
``fake`` backend: collectives do nothing, everything around them runs), recorded by the
estimate's own recorder and replayed by its CPU allocator model. What the estimate's
emulation (``estimation._data_parallel``) must reproduce.

FSDP2 frees and re-allocates its unsharded parameters by resizing their storages
(``_fsdp_param.alloc_storage / free_storage``), which no op shows: those two functions are
wrapped here to record the resizes. Everything else is what torch's code allocates.

Run as a script (``python parallel_oracle.py MODE MODEL WORLD_SIZE OPTIMIZER [ckpt] [bf16]``:
the fake process group is process-wide; ``ckpt`` checkpoints the repeated blocks first, as
``estimate(checkpointing=True)`` does; ``bf16`` casts the model and inputs to bfloat16, as
``estimate(dtype=torch.bfloat16)`` does): prints ``{"step_peaks": {step: bytes}}``. MODEL is a
name of ``parallel_models.MODELS`` or ``stack:IN,HIDDEN,WIDTH,DEPTH,OUT,BATCH`` (an MLP of
those sizes).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_flatten

from memlab_rs.estimation import _fake_step as fs
from memlab_rs.estimation.checkpointing import checkpoint_blocks, repeated_blocks
from memlab_rs.estimation.estimator import replay, step_peaks_of

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from parallel_models import OPTIMIZERS, loss_fn, model_named  # noqa: E402


def record_resizes(book: fs.Book) -> None:
    """FSDP2's storage resizes as allocations and frees of the book. The storage stays known
    to the book while it is empty (autograd keeps views of it), under its latest id."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    def alloc_storage(tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.itemsize
        storage = tensor.untyped_storage()
        if storage.size() != size:
            storage.resize_(size)
            book.live[storage._cdata] = book.held(size, "unsharded parameter", "parameter")

    def free_storage(tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        if storage.size() != 0:
            storage.resize_(0)
            ident = book.live.get(storage._cdata)
            if ident is not None:
                book.release(ident)

    _fsdp_param.alloc_storage = alloc_storage
    _fsdp_param.free_storage = free_storage
    _fsdp_param_group.alloc_storage = alloc_storage


class _LocalRecorder(fs._Recorder):
    """The recorder, seeing through DTensors: a DTensor's memory is its local tensor (the
    wrapper's storage is not memory), and its ops run on the local tensors below this mode,
    so each output's local tensor is what the op allocated."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, DTensor):
                self.book.see(t._local_tensor, str(func))
        return out


def _in_place(state: object, bucket: dist.GradBucket) -> torch.futures.Future:
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


# DDP checks the hook's annotations as objects (this module's are strings).
_in_place.__annotations__ = {
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}


def main() -> None:
    mode, name, world_size, optimizer = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    checkpointing = "ckpt" in sys.argv[5:]
    bf16 = "bf16" in sys.argv[5:]
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    torch.manual_seed(0)
    model, inputs = model_named(name)
    if bf16:  # as estimate(dtype=torch.bfloat16): the model and its float inputs cast
        model = model.to(torch.bfloat16)
        if inputs.is_floating_point():
            inputs = inputs.to(torch.bfloat16)
    if checkpointing:
        checkpoint_blocks(model)
    book = fs.Book("cpu")
    plain = book.counts
    book.counts = lambda t: not isinstance(t, DTensor) and plain(t)  # type: ignore[method-assign]
    book.phase_begin("setup")
    recorder = _LocalRecorder(book, None)
    if mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        record_resizes(book)
        for block in repeated_blocks(model):
            fully_shard(block)
        fully_shard(model)
        for p in model.parameters():
            book.see(p.to_local(), "parameter", "parameter")
        for b in model.buffers():
            book.see(b, "buffer", "buffer")
        step_model: nn.Module = model
    else:
        for p in model.parameters():
            book.see(p, "parameter", "parameter")
        for b in model.buffers():
            book.see(b, "buffer", "buffer")
        with recorder:  # the reducer's buckets
            step_model = nn.parallel.DistributedDataParallel(model)
        # The fake group's all-reduce has no result: the hook returns the bucket itself,
        # as NCCL's in-place all-reduce does.
        step_model.register_comm_hook(None, _in_place)
    book.see(inputs, "input", "input")
    opt = OPTIMIZERS[optimizer](step_model.parameters())
    with recorder:
        for step in (1, 2):
            book.phase_begin(f"forward {step}")
            out = step_model(inputs)
            loss = loss_fn(out)
            book.phase_begin(f"backward {step}")
            loss.backward()
            book.phase_begin(f"optimizer {step}")
            opt.step()
            opt.zero_grad(set_to_none=True)
            del out, loss
    book.sealed = True
    r = replay(book)
    step_peaks = step_peaks_of(dict(zip(book.phase_names, r["phase_peaks"])), 2)
    print(json.dumps({"step_peaks": step_peaks}))


if __name__ == "__main__":
    main()
