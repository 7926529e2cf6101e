"""NeuMF, a small recommender whose backward passes gradients between many nodes: the
monitor's intermediate-gradient tests run it on CPU (tests/unit/monitor) and CUDA (tests/gpu)."""

from __future__ import annotations

import torch
from torch import nn


class NeuMF(nn.Module):
    """Neural matrix factorisation (He et al. 2017): a generalised matrix factorisation of
    user and item embeddings beside an MLP over two more, joined by one output layer."""

    def __init__(self, users=1000, items=2000, factors=8, layers=(64, 32, 16, 8)):
        super().__init__()
        self.gmf_user = nn.Embedding(users, factors)
        self.gmf_item = nn.Embedding(items, factors)
        self.mlp_user = nn.Embedding(users, layers[0] // 2)
        self.mlp_item = nn.Embedding(items, layers[0] // 2)
        mlp: list[nn.Module] = []
        for a, b in zip(layers, layers[1:]):
            mlp += [nn.Linear(a, b), nn.ReLU()]
        self.mlp = nn.Sequential(*mlp)
        self.predict = nn.Linear(factors + layers[-1], 1)

    def forward(self, user, item):
        gmf = self.gmf_user(user) * self.gmf_item(item)
        mlp = self.mlp(torch.cat([self.mlp_user(user), self.mlp_item(item)], dim=-1))
        return self.predict(torch.cat([gmf, mlp], dim=-1)).squeeze(-1)
