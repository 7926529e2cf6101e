"""Mixed precision in the fake step: the autocast region of forward and the loss, and the
GradScaler's work.

- ``device="cpu"``: the step runs on fake CPU tensors, so the real
  ``torch.autocast("cpu", dtype)`` applies (its C++ kernels cast fake CPU tensors as real
  ones, with the weights' cast cache);
- ``device="cuda"``: the step runs on fake meta tensors, where CUDA's autocast is put back
  by ``_cuda_dispatch`` (its region is ``CudaDispatch.autocast``).

The GradScaler is torch's own ``torch.amp.GradScaler`` on the device the step runs on
(``"meta"`` for CUDA: ``GradScaler("cuda")`` turns itself off without a GPU), so its
tensors (the scale and growth tracker, the scaled loss, ``found_inf`` and the inverse scale
with their per-device copies, ``unscale_``'s in-place
``_amp_foreach_non_finite_check_and_unscale_``, ``update``'s ``_amp_update_scale_``) are
made by its own code. One thing differs: before stepping, the real one reads ``found_inf``
with ``.item()`` (a value fake tensors do not have; it allocates nothing); the estimate
assumes the gradients finite and steps.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from .. import _args

MIXED = (torch.bfloat16, torch.float16)


def check(autocast: Any, grad_scaler: Any, backward: bool) -> None:
    """The mixed-precision arguments, checked before anything is built."""
    if autocast is not None and autocast not in MIXED:
        kind = TypeError if not isinstance(autocast, torch.dtype) else ValueError
        raise kind(
            "autocast must be torch.bfloat16, torch.float16 or None (no autocast), got "
            f"{_args.shown(autocast)}"
        )
    if not isinstance(grad_scaler, bool):
        raise TypeError(f"grad_scaler must be True or False, got {_args.shown(grad_scaler)}")
    if grad_scaler and not backward:
        raise ValueError("grad_scaler=True scales the loss for backward: it needs backward=True")


class _FiniteScaler(torch.amp.GradScaler):
    """torch's GradScaler, stepping without reading ``found_inf`` (assumed all zero)."""

    def _maybe_opt_step(self, optimizer: Any, optimizer_state: Any, *args: Any, **kwargs: Any):
        return optimizer.step(*args, **kwargs)


class Amp:
    """What the step does in mixed precision: ``region()`` around forward and the loss,
    ``scaler`` (or None) for backward and the optimizer."""

    def __init__(self, autocast: torch.dtype | None, grad_scaler: bool, dispatch: Any, run_on):
        self.dtype = autocast
        self.dispatch = dispatch  # the CUDA dispatch (CUDA's autocast), or None on CPU
        self.scaler = _FiniteScaler(run_on.type) if grad_scaler else None

    def region(self) -> AbstractContextManager[Any]:
        if self.dtype is None:
            return nullcontext()
        if self.dispatch is not None:
            return self.dispatch.autocast(self.dtype)
        return torch.autocast("cpu", dtype=self.dtype)

    def scaler_tensors(self) -> list[torch.Tensor]:
        """The scale and the growth tracker, kept from step to step."""
        if self.scaler is None:
            return []
        kept = (getattr(self.scaler, "_scale", None), getattr(self.scaler, "_growth_tracker", None))
        return [t for t in kept if isinstance(t, torch.Tensor)]
