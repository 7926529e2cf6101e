"""What kernels allocate inside one op, as the estimate models it, against the device:
the reduction kernel's staging buffer (memlab_rs.estimation._cuda_reduce) for random
shapes, layouts (permuted views) and reduced dimensions, the scratch a real ``sum``/``mean``
takes above its output (max_memory_allocated around the op) equal to the model's to the
byte of the caching allocator's 512-byte blocks (but for at most 1% of them, by at most
128 KiB: see the test); and mm's contiguous copies of operands cuBLAS cannot read
(memlab_rs.estimation._cuda_blas) for random layouts, exactly."""

from __future__ import annotations

import random

import pytest
import torch

from memlab_rs.estimation._cuda_blas import operand_copies
from memlab_rs.estimation._cuda_reduce import device_shape, reduction_scratch

pytestmark = pytest.mark.cuda


def _blocks(n: int) -> int:
    return -(-n // 512) * 512


def _cases(n: int):
    rng = random.Random(24)
    for _ in range(n):
        ndim = rng.randint(1, 4)
        shape = [rng.choice([1, 3, 16, 64, 128, 300, 1024, 2048, 4096]) for _ in range(ndim)]
        while torch.Size(shape).numel() > 1 << 26:
            shape[rng.randrange(ndim)] //= 4
        dims = sorted(rng.sample(range(ndim), rng.randint(1, ndim)))
        perm = list(range(ndim))
        if rng.random() < 0.3:
            rng.shuffle(perm)
        dtype = rng.choice([torch.float32, torch.bfloat16, torch.float16])
        op = rng.choice(["sum", "mean"])
        yield shape, dims, perm, dtype, op


def test_random_reductions_take_the_scratch_the_model_says():
    shape_of_gpu = device_shape(torch.device("cuda:0"))
    misses = []
    checked = 0
    for shape, dims, perm, dtype, op in _cases(300):
        x = torch.randn(shape, device="cuda", dtype=dtype).permute(perm)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = getattr(x, op)(dims)
        torch.cuda.synchronize()
        scratch = (
            torch.cuda.max_memory_allocated() - before - _blocks(out.untyped_storage().nbytes())
        )
        model = sum(_blocks(b) for b in reduction_scratch(x, dims, *shape_of_gpu))
        checked += 1
        if scratch != model:
            misses.append((tuple(x.shape), x.stride(), dims, str(dtype), op, scratch, model))
        del x, out
    print(f"{checked} reductions, {len(misses)} differ: {misses}")
    # On an H200 (torch 2.11) 299 of these 300 matched to the byte; the other, a bf16 sum
    # over a 16-long outer dimension of a permuted (300, 2048, 16) view, took 80 KiB that
    # setReduceConfig does not explain (the model says none). Allow that much, no more.
    assert len(misses) <= checked // 100, misses[:10]
    assert all(abs(real - model) <= 128 * 1024 for *_, real, model in misses), misses


def _operands(n: int):
    """Random matrices in the layouts a step hands to mm: dense, transposed, expanded (a
    gradient of a sum), sliced by rows, columns or steps."""
    rng = random.Random(23)
    for _ in range(n):
        rows, cols = rng.choice([64, 300, 1024]), rng.choice([64, 256, 2048])
        kind = rng.choice(["dense", "t", "expanded", "rows", "cols", "step"])
        dtype = rng.choice([torch.float32, torch.bfloat16])
        if kind == "dense":
            a = torch.randn(rows, cols, device="cuda", dtype=dtype)
        elif kind == "t":
            a = torch.randn(cols, rows, device="cuda", dtype=dtype).t()
        elif kind == "expanded":
            a = torch.randn(1, 1, device="cuda", dtype=dtype).expand(rows, cols)
        elif kind == "rows":
            a = torch.randn(rows * 2, cols, device="cuda", dtype=dtype)[::2]
        elif kind == "cols":
            a = torch.randn(rows, cols * 2, device="cuda", dtype=dtype)[:, :cols]
        else:
            a = torch.randn(rows, cols * 2, device="cuda", dtype=dtype)[:, ::2]
        yield kind, a, torch.randn(cols, 128, device="cuda", dtype=dtype)


def test_mm_copies_the_operands_cublas_cannot_read_as_the_model_says():
    for dtype in (torch.float32, torch.bfloat16):  # the cuBLAS workspaces, kept, come first
        torch.mm(
            torch.ones(8, 8, device="cuda", dtype=dtype),
            torch.ones(8, 8, device="cuda", dtype=dtype),
        )
    misses = []
    checked = 0
    for kind, a, b in _operands(120):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        out = torch.mm(a, b)
        torch.cuda.synchronize()
        scratch = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
        model = sum(_blocks(c) for c in operand_copies("aten.mm.default", (a, b)))
        checked += 1
        if scratch != model:
            misses.append((kind, tuple(a.shape), a.stride(), str(a.dtype), scratch, model))
        del a, b, out
    print(f"{checked} matrix products, {len(misses)} differ: {misses}")
    assert not misses, misses[:10]


def test_softmax_backward_takes_the_buffer_the_model_says():
    """Exactly the gradient's bytes, but for rows whose length the kernel pads (bfloat16
    rows of 1000 took 1024's on an H200): within 3%, and exact for nine in ten."""
    from memlab_rs.estimation._cuda_softmax import softmax_backward_scratch

    rng = random.Random(25)
    exact = checked = 0
    for _ in range(60):
        shape = [
            rng.choice([4, 32, 160]),
            rng.choice([1, 4, 12]),
            rng.choice([64, 100, 128, 1000, 1024, 4096]),
        ]
        dtype = rng.choice([torch.float32, torch.bfloat16, torch.float16])
        y = torch.softmax(torch.randn(shape, device="cuda", dtype=dtype), -1)
        g = torch.randn_like(y)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        out = torch.ops.aten._softmax_backward_data(g, y, -1, dtype)
        torch.cuda.synchronize()
        scratch = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
        (model,) = softmax_backward_scratch(
            "aten._softmax_backward_data.default", (g, y, -1, dtype)
        )
        model = _blocks(model)
        checked += 1
        exact += scratch == model
        assert model <= scratch <= model * 1.03 + 512, (shape, dtype, scratch, model)
        del y, g, out
    print(f"{checked} softmax backwards, {exact} exact")
    assert exact >= 0.9 * checked


def _allocations(op, *args) -> tuple[list[int], object]:
    """The requested bytes of each allocation ``op(*args)`` makes, in order (the allocator's
    own history), and what it returned."""
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100_000, context=None)
    try:
        out = op(*args)
        torch.cuda.synchronize()
        trace = torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return [e["size"] for e in trace if e["action"] == "alloc"], out


def test_layer_norm_copies_its_strided_inputs_first_as_the_model_says():
    """Forward and backward of random layer norms on permuted, sliced and dense inputs:
    the kernel's first allocations are the copies the model names (none for a dense
    input), before its outputs."""
    from memlab_rs.estimation._cuda_layer_norm import input_copies

    rng = random.Random(26)
    aten = torch.ops.aten
    checked = 0
    for _ in range(40):
        rows, width = rng.choice([16, 300, 3136]), rng.choice([64, 96, 768])
        dtype = rng.choice([torch.float32, torch.bfloat16])
        layout = rng.choice(["dense", "permuted", "sliced"])
        if layout == "dense":
            x = torch.randn(rows, width, device="cuda", dtype=dtype)
        elif layout == "permuted":  # channels moved last, as Swin's patch embedding does
            x = torch.randn(2, width, rows, device="cuda", dtype=dtype).permute(0, 2, 1)
        else:
            x = torch.randn(rows, width * 2, device="cuda", dtype=dtype)[:, :width]
        w = torch.randn(width, device="cuda", dtype=dtype)
        b = torch.randn(width, device="cuda", dtype=dtype)
        args = (x, [width], w, b, 1e-5)
        allocs, (_y, mean, rstd) = _allocations(aten.native_layer_norm, *args)
        copies = input_copies("aten.native_layer_norm.default", args)
        assert allocs[: len(copies)] == copies, (layout, x.shape, x.stride(), allocs, copies)
        assert len(allocs) == len(copies) + 3, (layout, allocs, copies)  # out, mean, rstd
        g = torch.randn(x.shape, device="cuda", dtype=dtype)
        args = (g, x, [width], mean, rstd, w, b, [True, True, True])
        allocs, _grads = _allocations(aten.native_layer_norm_backward, *args)
        copies = input_copies("aten.native_layer_norm_backward.default", args)
        assert allocs[: len(copies)] == copies, (layout, allocs, copies)
        checked += 1
    assert checked == 40
