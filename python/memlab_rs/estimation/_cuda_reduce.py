"""The scratch CUDA's reduction kernel takes from the caching allocator, which fake
tensors cannot show: ``gpu_reduce_kernel`` (aten/src/ATen/native/cuda/Reduce.cuh) splits a
long reduction across thread blocks when its outputs are few, and then allocates a staging
buffer (``ReduceConfig::global_memory_size``) and semaphores for the blocks' partial
results, for the duration of the kernel. Summing over a non-innermost dimension (every
``nn.Linear`` bias gradient: ``grad.sum(0)``) takes the most: 84 MiB for a 5376 x 2048
float32 gradient on an H100/H200, twice the gradient itself, measured on an H200 with
``bench/zoo_hidden.py``'s probe and reproduced here to the byte.

``reduction_scratch`` replays ``setReduceConfig`` (torch 2.4 to 2.11 and the header of the
torch installed here agree) over the TensorIterator the op would build: dimensions
reordered (reduced ones first, then by stride) and coalesced as ``TensorIteratorBase``
does. The device's SM count and threads per SM come from the GPU when one is here, else
an H100's (132, 2048), as the cuBLAS workspace assumes sm90."""

from __future__ import annotations

import torch

#: aten reductions that run ``gpu_reduce_kernel`` with a float accumulator for 16- and
#: 32-bit floating inputs (``at::acc_type``), double for float64, int64 for integers.
_REDUCTIONS = {"aten.sum.dim_IntList", "aten.mean.dim"}

_MIN_VALUES_PER_THREAD = 16
_MAX_VALUES_PER_THREAD = 256
_VT0 = 4  # sum and mean: gpu_reduce_kernel<scalar_t, out_t> defaults (vt0 = input_vec_size = 4)
_WARP = 32
_H100 = (132, 2048)  # multiProcessorCount, maxThreadsPerMultiProcessor


def staging(name: str, args: tuple, kwargs: dict, sms: int, threads_per_sm: int) -> list[int]:
    """The bytes the CUDA kernel of op `name` called with `args`/`kwargs` allocates inside
    the op: ``reduction_scratch`` for the reductions modelled, [] for any other op (and for
    one given ``dtype=``, whose cast input is not modelled)."""
    if name not in _REDUCTIONS or kwargs.get("dtype") is not None:
        return []
    if not args or not isinstance(args[0], torch.Tensor):
        return []
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    return reduction_scratch(args[0], dims, sms, threads_per_sm)


def device_shape(device: torch.device | None) -> tuple[int, int]:
    """(SMs, threads per SM) of the GPU modelled: this machine's, else an H100's."""
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        return int(props.multi_processor_count), int(props.max_threads_per_multi_processor)
    return _H100


def reduction_scratch(
    tensor: torch.Tensor, dims: list[int] | None, sms: int, threads_per_sm: int
) -> list[int]:
    """The bytes the reduction of `tensor` over `dims` (None or []: all) allocates inside
    the kernel, in order: [staging buffer, semaphores], or [] when it needs none."""
    shape = list(tensor.shape)
    ndim = len(shape)
    numel = tensor.numel()
    if ndim == 0 or numel == 0 or numel > 2**31 - 1:
        # A scalar or an empty tensor launches nothing; one that needs 64-bit indexing is
        # split into sub-reductions (not modelled: their scratch is not counted).
        return []
    reduced = {d % ndim for d in dims} if dims else set(range(ndim))
    elem = tensor.element_size()
    acc = _accumulator_bytes(tensor.dtype)
    in_strides = [s * elem for s in tensor.stride()]
    out_strides = _output_strides(shape, reduced, elem)
    order = _reorder(shape, in_strides, out_strides)
    shape = [shape[d] for d in order]
    in_strides = [in_strides[d] for d in order]
    out_strides = [out_strides[d] for d in order]
    shape, in_strides, out_strides = _coalesce(shape, in_strides, out_strides)
    ndim = len(shape)
    num_reduce = sum(1 for s in out_strides if s == 0)
    num_outputs = 1
    for size, out in zip(shape, out_strides):
        if out != 0:
            num_outputs *= size
    inputs_per_output = numel // num_outputs
    fastest_on_reduction = num_reduce == ndim or in_strides[0] < in_strides[num_reduce]
    if fastest_on_reduction:
        dim0, dim1, fastest = inputs_per_output, num_outputs, in_strides[0]
    else:
        dim0, dim1, fastest = num_outputs, inputs_per_output, in_strides[num_reduce]
    output_vec = 1
    if fastest == elem:
        if fastest_on_reduction and dim0 >= 128 and num_reduce == 1:
            dim0 //= _VT0  # "vectorize along input"
        elif not fastest_on_reduction:
            output_vec = _output_vec_size(tensor, shape, in_strides, num_reduce, elem)
            dim0 //= output_vec
    max_threads = (256 if tensor.dtype == torch.complex128 else 512) // output_vec
    dim0_pow2 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    width = min(dim0_pow2, _WARP)
    height = min(dim1_pow2, max_threads // width)
    width = min(dim0_pow2, max_threads // height)
    step_input = step_output = 1
    if fastest_on_reduction:
        step_input *= width  # input_mult[0]: block_x_reduce
    else:
        step_output *= width
    values = -(-inputs_per_output // step_input)
    split_warps = values >= min(height * 16, _MAX_VALUES_PER_THREAD)
    if split_warps:
        step_input *= height
    else:
        step_output *= height
    blocks_per_sm = threads_per_sm // (width * height)
    target_grid = sms * blocks_per_sm
    grid = -(-(num_outputs // output_vec) // step_output)
    values = -(-inputs_per_output // step_input)
    if not (split_warps and values >= _MAX_VALUES_PER_THREAD and grid <= target_grid):
        return []
    ctas1 = -(-target_grid // grid)
    ctas2 = -(-values // _MIN_VALUES_PER_THREAD)
    ctas3 = -(-values // _MAX_VALUES_PER_THREAD)
    ctas = min(max(ctas1, ctas3), ctas2)  # std::clamp(ctas1, ctas3, ctas2)
    if ctas <= 1:
        return []
    buffer = acc * num_outputs * ctas
    if not fastest_on_reduction:  # no block_x_reduce: one slot per lane and vector
        buffer *= width * output_vec
    return [buffer, 4 * grid]


def _accumulator_bytes(dtype: torch.dtype) -> int:
    """sizeof(at::acc_type<scalar_t, true>): float for 16- and 32-bit floats, double for
    float64, the complex of the input's precision, int64 for integers and bool."""
    if dtype.is_complex:
        return 8 if dtype == torch.complex64 else 16
    if dtype.is_floating_point:
        return 8 if dtype == torch.float64 else 4
    return 8


def _output_strides(shape: list[int], reduced: set[int], elem: int) -> list[int]:
    """The keepdim output's byte strides, 0 on the reduced dimensions (review_reduce_result),
    over a contiguous output of the input's element size (the iterator's strides are only
    compared and tested for zero)."""
    strides = [0] * len(shape)
    running = elem
    for d in reversed(range(len(shape))):
        if d in reduced:
            continue
        strides[d] = running
        running *= shape[d]
    return strides


def _reorder(shape: list[int], in_strides: list[int], out_strides: list[int]) -> list[int]:
    """TensorIteratorBase::reorder_dimensions for a reduction: reduced dimensions first,
    then fastest-moving first (an insertion sort that leaves ambiguous pairs alone)."""

    def should_swap(d0: int, d1: int) -> int:
        s0, s1 = out_strides[d0], out_strides[d1]
        if (s0 == 0) != (s1 == 0):
            return 1 if s1 == 0 else -1
        for strides in (out_strides, in_strides):
            s0, s1 = strides[d0], strides[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = list(reversed(range(len(shape))))
    for i in range(1, len(perm)):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[d0], perm[d1])
            if comparison > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif comparison < 0:
                break
    return perm


def _coalesce(
    shape: list[int], in_strides: list[int], out_strides: list[int]
) -> tuple[list[int], list[int], list[int]]:
    """TensorIteratorBase::coalesce_dimensions: adjacent dimensions that are one for every
    operand merge (a size-1 dimension with anything)."""
    shape, ins, outs = list(shape), list(in_strides), list(out_strides)
    if len(shape) <= 1:
        return shape, ins, outs
    prev = 0
    for dim in range(1, len(shape)):
        mergeable = (
            shape[prev] == 1
            or shape[dim] == 1
            or all(shape[prev] * strides[prev] == strides[dim] for strides in (ins, outs))
        )
        if mergeable:
            if shape[prev] == 1:
                ins[prev], outs[prev] = ins[dim], outs[dim]
            shape[prev] *= shape[dim]
        else:
            prev += 1
            if prev != dim:
                ins[prev], outs[prev] = ins[dim], outs[dim]
                shape[prev] = shape[dim]
    return shape[: prev + 1], ins[: prev + 1], outs[: prev + 1]


def _output_vec_size(
    tensor: torch.Tensor, shape: list[int], in_strides: list[int], num_reduce: int, elem: int
) -> int:
    """get_output_vec_size: 4, halved until it divides the input's address (in elements),
    the first output dimension's size and every other input stride (in elements). The
    caching allocator's blocks are 512-byte aligned: the address is the storage offset."""
    vec = 4

    def update(n: int) -> None:
        nonlocal vec
        while n % vec != 0:
            vec //= 2

    update(int(tensor.storage_offset()))
    update(shape[num_reduce])
    for j, stride in enumerate(in_strides):
        if j != num_reduce:
            update(stride // elem)
    return vec


def _last_pow2(n: int) -> int:
    """The largest power of two <= n (at least 1), as Reduce.cuh's last_pow2."""
    return max(1, 1 << (max(n, 1).bit_length() - 1))
