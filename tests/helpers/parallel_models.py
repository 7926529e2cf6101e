"""The models the data-parallel oracle and the estimate's tests share: (model, inputs)
factories, small enough for a CPU step, with repeated blocks to shard, tied weights,
batch-norm buffers and dimensions no world size divides."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from memlab_rs.models import TinyGPT


class _Stack(nn.Module):
    def __init__(self, dims: tuple[int, ...], width: int, depth: int, out: int):
        super().__init__()
        self.inp = nn.Linear(dims[0], width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, dims[1]), nn.ReLU(), nn.Linear(dims[1], width))
            for _ in range(depth)
        )
        self.head = nn.Linear(width, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _conv_block(c: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())


def _mlp() -> tuple[nn.Module, Any]:
    return _Stack((100, 128), 64, 3, 10), torch.randn(32, 100)


def _ragged() -> tuple[nn.Module, Any]:
    return _Stack((37, 53), 29, 4, 7), torch.randn(13, 37)


def _wide() -> tuple[nn.Module, Any]:  # 50 MB of parameters: DDP fills several buckets
    return _Stack((300, 2048), 1024, 3, 10), torch.randn(8, 300)


def _blocks_only() -> tuple[nn.Module, Any]:  # every parameter in a block: the root has none
    blocks = [nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 64)) for _ in range(3)]
    return nn.Sequential(*blocks), torch.randn(16, 64)


def _tinygpt() -> tuple[nn.Module, Any]:
    model = TinyGPT(vocab=256, dim=64, layers=3, heads=4, context=32)
    return model, torch.randint(0, 256, (4, 32))


def _cnn() -> tuple[nn.Module, Any]:
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.Sequential(*(_conv_block(16) for _ in range(3))),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )
    return model, torch.randn(8, 3, 16, 16)


MODELS: dict[str, Callable[[], tuple[nn.Module, Any]]] = {
    "mlp": _mlp,
    "ragged": _ragged,
    "wide": _wide,
    "blocks_only": _blocks_only,
    "tinygpt": _tinygpt,
    "cnn": _cnn,
}


def model_named(name: str) -> tuple[nn.Module, Any]:
    """A model of ``MODELS``, or ``stack:IN,HIDDEN,WIDTH,DEPTH,OUT,BATCH``: an MLP of
    repeated blocks of those sizes and its inputs (seeded: the same on both sides)."""
    torch.manual_seed(0)
    if name.startswith("stack:"):
        n_in, hidden, width, depth, out, batch = (int(v) for v in name[6:].split(","))
        return _Stack((n_in, hidden), width, depth, out), torch.randn(batch, n_in)
    return MODELS[name]()


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
}


def loss_fn(out: torch.Tensor) -> torch.Tensor:
    return out.float().pow(2).mean()
