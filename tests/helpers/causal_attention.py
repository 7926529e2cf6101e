"""One causal self-attention layer (a qkv projection, then SDPA) for the estimate's tests of
the SDPA kernel CUDA picks: batch 2 x 128 tokens of width 64, one head."""

from __future__ import annotations

import torch


class CausalAttention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(2, 128, 3, 1, 64).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
