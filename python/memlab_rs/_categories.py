"""The categories of memory that the training monitor and the estimate report, in the order
they are shown: the same kinds as PyTorch's own trackers
(``torch.distributed._tools.mem_tracker``: PARAM, BUFFER, GRAD, ACT, TEMP, OPT, OTH), so a
figure from one tool can be read next to the other's.

- ``parameter``: storages of the model's parameters (tied weights once).
- ``buffer``: storages of the model's buffers (running statistics, masks).
- ``gradient``: storages of the parameters' ``.grad``.
- ``activation``: storages autograd saved for backward (parameters excluded).
- ``temporary``: what a phase allocated above its known tensors: intermediate gradients,
  workspaces, the optimizer step's scratch tensors.
- ``optimizer_state``: storages in ``optimizer.state`` (momenta, second moments, steps).
- ``other``: everything else the allocator holds (inputs, targets, the loss, tensors of
  other models, memory allocated before monitoring began).

A storage belongs to one category only. Precedence: parameter, buffer, gradient,
optimizer state, activation (a parameter saved for backward stays a parameter);
``temporary`` and ``other`` are what is left, split by when it was allocated.

A floor below the rooms: the monitor and the estimation both import it, neither from the
other. The Rust side holds the same list (``src/results/categories.rs``).
"""

from __future__ import annotations

CATEGORIES: tuple[str, ...] = (
    "parameter",
    "buffer",
    "gradient",
    "activation",
    "temporary",
    "optimizer_state",
    "other",
)
