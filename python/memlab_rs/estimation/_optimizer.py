"""The optimizer of the fake step: built from a class and its keyword arguments, from a
factory taking the parameters, or from an instance the user already has (the same class,
each param group's hyperparameters, on the fake copy's parameters). The user's optimizer is
never modified and its state tensors' data are never read."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Union

import torch
from torch.utils._pytree import tree_map

#: What ``optimizer=`` takes: a class (with ``optimizer_kwargs``), a factory taking the
#: parameters, or an instance bound to the model's parameters.
OptimizerSpec = Union[Callable[..., torch.optim.Optimizer], torch.optim.Optimizer]


def make_optimizer(
    spec: Any,
    kwargs: dict[str, Any] | None,
    model: torch.nn.Module,
    fmodel: torch.nn.Module,
    fake: Callable[[torch.Tensor], torch.Tensor],
    cuda: bool,
    notes: list[str],
    held_by: Callable[[torch.nn.Parameter], torch.nn.Parameter] = lambda p: p,
) -> torch.optim.Optimizer | None:
    """The optimizer over `fmodel`'s parameters (run under the fake mode). `fake(t)` is a
    fake tensor like `t` where the step runs (hyperparameters given as tensors);
    `held_by(p)` is what the optimizer holds for parameter `p` (its shard under FSDP2)."""
    if spec is None:
        return None
    params = [held_by(p) for p in fmodel.parameters() if p.requires_grad]
    if isinstance(spec, torch.optim.Optimizer):
        opt = _from_instance(spec, model, fmodel, fake, notes, held_by)
    elif isinstance(spec, type) and issubclass(spec, torch.optim.Optimizer):
        opt = spec(params, **(kwargs or {}))
    elif callable(spec):
        if kwargs:
            raise TypeError("optimizer_kwargs go with an optimizer class, not a factory")
        opt = spec(params)
    else:
        raise TypeError(
            "optimizer must be an optimizer class, a factory taking the parameters or an "
            f"optimizer of the model's parameters, not {type(spec).__name__}"
        )
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError("the optimizer factory must return a torch.optim.Optimizer")
    if cuda:
        for group in opt.param_groups:
            if "foreach" in group and group["foreach"] is None and not group.get("fused"):
                # CUDA's default (_default_to_fused_or_foreach): whole-list temporaries.
                group["foreach"] = True
    return opt


def check_instance(optimizer: Any, optimizer_kwargs: Any) -> None:
    """An instance comes with its own hyperparameters: kwargs beside it are an error."""
    if isinstance(optimizer, torch.optim.Optimizer) and optimizer_kwargs:
        raise TypeError(
            "optimizer_kwargs go with an optimizer class: the optimizer instance given has "
            "its own hyperparameters (its param groups)"
        )


def _from_instance(
    opt: torch.optim.Optimizer,
    model: torch.nn.Module,
    fmodel: torch.nn.Module,
    fake: Callable[[torch.Tensor], torch.Tensor],
    notes: list[str],
    held_by: Callable[[torch.nn.Parameter], torch.nn.Parameter],
) -> torch.optim.Optimizer:
    """The same class as `opt` over the fake parameters, group by group with each group's
    hyperparameters (tensors among them as fakes), and with state where `opt` has some."""
    fake_of: dict[int, torch.nn.Parameter] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        fake_of.setdefault(id(p), held_by(fmodel.get_parameter(name)))

    def convert(value: Any) -> Any:
        return tree_map(lambda v: fake(v) if isinstance(v, torch.Tensor) else v, value)

    groups = []
    for index, group in enumerate(opt.param_groups):
        params = []
        for p in group["params"]:
            twin = fake_of.get(id(p))
            if twin is None:
                shape = tuple(p.shape) if isinstance(p, torch.Tensor) else None
                raise ValueError(
                    f"optimizer's param group {index} holds a tensor that is not a parameter "
                    f"of model (shape {shape}): pass the optimizer of this model's parameters"
                )
            params.append(twin)
        hyper = {k: convert(v) for k, v in group.items() if k != "params"}
        groups.append({"params": params, **hyper})
    cls = type(opt)
    defaults = {k: convert(v) for k, v in opt.defaults.items()}
    try:
        accepted = dict(inspect.signature(cls.__init__).parameters)
    except (TypeError, ValueError):
        accepted = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    given = {k: v for k, v in defaults.items() if takes_any or k in accepted}
    try:
        new = cls(groups, **given)
    except Exception as error:
        raise ValueError(
            f"optimizer: a {cls.__name__} could not be built on the fake parameters from its "
            f"defaults ({type(error).__name__}: {error}); pass its class with "
            "optimizer_kwargs or a factory taking the parameters"
        ) from error
    # Each group's values and the defaults exactly as the instance holds them (keys its
    # constructor does not take, such as AdamW's decoupled_weight_decay, included).
    for new_group, group in zip(new.param_groups, groups):
        new_group.update({k: v for k, v in group.items() if k != "params"})
    new.defaults = defaults
    stateful = [fake_of[id(p)] for p, s in opt.state.items() if s and id(p) in fake_of]
    if stateful:
        _make_state(new, stateful)
        notes.append(
            f"the optimizer has state ({len(stateful)} of its parameters): assumed to exist "
            "before the first step, as its own first step makes it"
        )
    return new


def _make_state(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> None:
    """State for `params` as the optimizer's own first step makes it: one step with zero
    gradients (outside the recording), the gradients dropped after."""
    with torch.no_grad():
        for p in params:
            p.grad = torch.zeros_like(p)
    try:
        opt.step()
    finally:
        for p in params:
            p.grad = None
