"""Autograd graphs for the tests of the graph walk (``_torch.autograd_nodes``) and of what
uses it, and an independent count of their nodes to check the walk against."""

from __future__ import annotations

import torch


def dense_graph(layers: int = 8, x: torch.Tensor | None = None) -> torch.Tensor:
    """A loss whose graph is densely connected: each layer sums the tanh of every earlier
    one, so a node is reached by many paths. `x`: the leaf (a new 4 x 8 one by default)."""
    if x is None:
        x = torch.randn(4, 8, requires_grad=True)
    hs = [x]
    for _ in range(layers):
        hs.append(sum(torch.tanh(h) for h in hs))
    return hs[-1].sum()


def distinct_nodes(loss: torch.Tensor) -> tuple[int, int]:
    """(the nodes behind `loss`, those of them with inputs), counted holding every node's
    object, so that ids stay theirs while counted; none is held after."""
    nodes: dict[int, object] = {}
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and id(node) not in nodes:
            nodes[id(node)] = node
            stack.extend(n for n, _ in node.next_functions)
    with_inputs = sum(1 for n in nodes.values() if n.next_functions)
    return len(nodes), with_inputs
