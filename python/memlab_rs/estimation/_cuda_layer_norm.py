"""The copies CUDA's layer norm makes of strided inputs, which fake tensors cannot show:
``layer_norm_cuda`` and ``layer_norm_backward_cuda`` (aten/src/ATen/native/cuda/
layer_norm_kernel.cu) begin with ``input.expect_contiguous()`` (and the same of the weight
and the bias), which clones a tensor that is not contiguous, before the outputs are
allocated, and frees the clone when the op returns. Swin's ``LayerNorm`` after the patch
embedding's ``Permute`` takes such a copy (19.3 MiB at 16 x 56 x 56 x 96 float32), seen in
the allocator's trace of a real step on an H200: alone it does not move the peak, but it
moves every later block of the step, and with it the segments the step reserves."""

from __future__ import annotations

import torch

#: aten ops whose CUDA kernel calls ``expect_contiguous`` on these arguments, by index.
_STRIDED = {
    "aten.native_layer_norm.default": (0, 2, 3),  # input, normalized_shape, weight, bias
    "aten.native_layer_norm_backward.default": (1, 5, 6),  # grad_out, input, ..., weight, bias
}


def input_copies(name: str, args: tuple) -> list[int]:
    """Bytes of each contiguous copy the CUDA kernel of `name` makes of its arguments before
    it allocates its outputs ([] for any other op, or when all are contiguous)."""
    where = _STRIDED.get(name)
    if where is None:
        return []
    copies = []
    for i in where:
        t = args[i] if i < len(args) else None
        if isinstance(t, torch.Tensor) and t.numel() and not t.is_contiguous():
            copies.append(t.numel() * t.element_size())
    return copies
