"""The GPU workloads of the trace benchmarks (CONTRIBUTING.md), built with random weights.

The same three as ``bench/line_profiler_overhead.py`` (which builds them inside a function,
so they are rebuilt here): GPT-2 (124M) with AdamW at batch 8x512 and 1x64, ResNet-50 at
64x3x224x224 with SGD and momentum. Each builder returns ``(train_step, model)``.
"""

from __future__ import annotations

import torch

WORKLOADS = ("gpt2-8x512", "gpt2-1x64", "resnet50")
TITLES = {
    "gpt2-8x512": "GPT-2 8x512 AdamW",
    "gpt2-1x64": "GPT-2 1x64 AdamW",
    "resnet50": "ResNet-50 64x3x224x224 SGD momentum",
}


def gpt2(batch: int, tokens: int, device: str = "cuda:0"):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 50257, (batch, tokens), device=device)

    def train_step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return train_step, model


def resnet(device: str = "cuda:0"):
    from torchvision.models import resnet50

    torch.manual_seed(0)
    model = resnet50().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (64,), device=device)

    def train_step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return train_step, model


def build(name: str):
    """``(train_step, model)`` of the workload `name` (one of WORKLOADS)."""
    if name == "gpt2-8x512":
        return gpt2(8, 512)
    if name == "gpt2-1x64":
        return gpt2(1, 64)
    if name == "resnet50":
        return resnet()
    raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
