"""The copies CUDA's matrix multiply makes of operands cuBLAS cannot read, which fake
tensors cannot show: ``prepare_matrix_for_cublas`` (aten/src/ATen/native/cuda/Blas.cpp)
passes a matrix as it is when it is dense (contiguous, or a transpose of that) or has a
unit stride and a leading one at least its size; any other (an expanded gradient with
strides (0, 0), as ``out.sum()``'s backward sends through a bias-free Linear) is cloned
contiguous for the call and freed after it. A 1000 x 20480 float32 expanded gradient took
78.1 MiB in TinyGPT's backward on an H200, as this says."""

from __future__ import annotations

import torch

#: aten ops whose CUDA kernel prepares its two matrix operands this way, with their indices.
_MATRICES = {"aten.mm.default": (0, 1), "aten.addmm.default": (1, 2)}


def operand_copies(name: str, args: tuple) -> list[int]:
    """Bytes of each contiguous copy the CUDA kernel of `name` makes of its operands."""
    where = _MATRICES.get(name)
    if where is None:
        return []
    copies = []
    for i in where:
        t = args[i] if i < len(args) else None
        if isinstance(t, torch.Tensor) and t.dim() == 2 and _needs_copy(t):
            copies.append(t.numel() * t.element_size())
    return copies


def _needs_copy(t: torch.Tensor) -> bool:
    if non_overlapping_and_dense(list(t.shape), list(t.stride())):
        return False
    (n0, n1), (s0, s1) = t.shape, t.stride()
    if s0 == 1 and s1 >= max(1, n0):
        return False
    return not (s1 == 1 and s0 >= max(1, n1))


def non_overlapping_and_dense(sizes: list[int], strides: list[int]) -> bool:
    """c10's compute_non_overlapping_and_dense: the dimensions, by stride (size-1 ones
    last), tile memory without gaps or overlaps."""
    if len(sizes) == 1:
        return sizes[0] < 2 or strides[0] == 1
    order = sorted(range(len(sizes)), key=lambda d: (sizes[d] < 2, strides[d]))
    required = 1
    for d in order:
        if sizes[d] < 2:
            return True
        if strides[d] != required:
            return False
        required *= sizes[d]
    return True
