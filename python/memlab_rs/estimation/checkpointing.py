"""Activation checkpointing of a model's repeated blocks, as users turn it on: transformers'
``gradient_checkpointing_enable`` (non-reentrant) for a model that has it, else each
repeated block wrapped in ``torch.utils.checkpoint.checkpoint`` (non-reentrant). What a
block saves for backward is then recomputed in backward instead: its inputs stay, its
inner activations go. ``estimate(..., checkpointing=True)`` and ``plan`` apply it to the
fake copy of the model (never to the user's); the validation zoo applies the same function
to the real model, so the two steps checkpoint alike."""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint


class Checkpointed(nn.Module):
    """Runs `block` under ``torch.utils.checkpoint`` (non-reentrant)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def repeated_blocks(module: nn.Module) -> list[nn.Module]:
    """The repeated blocks of `module`, in module order: the children of a container
    (``nn.Sequential``, ``nn.ModuleList``) of which at least two are of one class and have
    children themselves (ResNet's bottlenecks, ViT's encoder layers, a decoder's layers);
    the innermost such containers only. What checkpointing wraps and FSDP2 shards."""
    found: list[nn.Module] = []
    for child in module.children():
        found.extend(repeated_blocks(child))
    if found or not isinstance(module, (nn.Sequential, nn.ModuleList)):
        return found
    counts: dict[type, int] = {}
    for child in module.children():
        if any(True for _ in child.children()):
            counts[type(child)] = counts.get(type(child), 0) + 1
    repeated = {cls for cls, n in counts.items() if n >= 2}
    return [child for child in module.children() if type(child) in repeated]


def checkpoint_blocks(module: nn.Module) -> int:
    """Wrap the repeated blocks of `module` (``repeated_blocks``) in ``Checkpointed``, in
    place. Returns the number of blocks wrapped."""
    blocks = {id(b) for b in repeated_blocks(module)}
    wrapped = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in blocks:
                parent._modules[name] = Checkpointed(child)
                wrapped += 1
    return wrapped


def enable_checkpointing(model: nn.Module) -> str:
    """Turn on activation checkpointing of `model`'s repeated blocks, in place; says how
    (for the estimate's notes). A ValueError when the model has no repeated blocks."""
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if getattr(model, "supports_gradient_checkpointing", False) and callable(enable):
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return "transformers' gradient_checkpointing_enable (non-reentrant)"
    wrapped = checkpoint_blocks(model)
    if wrapped == 0:
        raise ValueError(
            f"checkpointing=True: {type(model).__name__} has no repeated blocks to checkpoint "
            "(two or more children of one class in an nn.Sequential or nn.ModuleList); "
            "checkpoint inside your model's forward and leave checkpointing off"
        )
    return f"{wrapped} repeated blocks under torch.utils.checkpoint (non-reentrant)"
