"""``memlab-rs estimate module:factory``: the what-if plan (``memlab_rs.plan``) of a model
the user's own factory builds, printed as a table (and saved with ``--save``).

The factory is called with no arguments and returns ``(model, make_inputs)`` or a dict
with ``model`` and ``make_inputs`` and, optionally, ``make_targets``, ``loss_fn``,
``optimizer``, ``optimizer_kwargs`` and ``size`` (the baseline's, when ``--size`` is not
given). ``module`` is a module name importable from the current directory (as ``python -m``
finds it) or a path to a ``.py`` file; importing it runs its code, as running it would.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from typing import Any

from . import _arguments
from .command import CliError, Command

#: ``--optimizer`` and ``--optimizers`` by name: (class name in torch.optim, its kwargs).
OPTIMIZERS: dict[str, tuple[str, dict[str, Any]]] = {
    "sgd": ("SGD", {"lr": 1e-2}),
    "sgd-momentum": ("SGD", {"lr": 1e-2, "momentum": 0.9}),
    "adam": ("Adam", {"lr": 1e-3}),
    "adam-fused": ("Adam", {"lr": 1e-3, "fused": True}),
    "adamw": ("AdamW", {"lr": 1e-3}),
    "adamw-fused": ("AdamW", {"lr": 1e-3, "fused": True}),
}

#: The precisions ``memlab_rs.plan`` takes (``estimation.what_if.PRECISIONS``), listed here
#: so that ``--help`` imports no torch (a contract test keeps the two lists equal).
PRECISIONS = ("as given", "fp32", "bf16", "fp16", "amp-bf16", "amp-fp16")
#: The data-parallel modes (``estimation._data_parallel.MODES``), for the same reason.
PARALLEL_MODES = ("ddp", "fsdp2")


class EstimateCommand(Command):
    name = "estimate"
    help = "what-if plan of a training step's memory, before training"
    description = (
        "Estimate one training step of the model FACTORY builds (module:function; it returns "
        "(model, make_inputs) or a dict with model, make_inputs and optionally make_targets, "
        "loss_fn, optimizer, optimizer_kwargs, size), allocating nothing, over the choices: "
        "the size, the precision, activation checkpointing, the optimizer; with the largest "
        "size that fits the budget and the choice that saves the most."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("factory", metavar="MODULE:FACTORY")
        parser.add_argument(
            "--size", type=int, help="the baseline's size (default: the factory's, else 8)"
        )
        parser.add_argument(
            "--size-name",
            default="batch size",
            help="what make_inputs' argument is (default: batch size)",
        )
        parser.add_argument(
            "--device",
            default="cuda:0",
            help="the device modelled (default: cuda:0; no GPU needed)",
        )
        parser.add_argument(
            "--budget",
            type=_arguments.size_argument,
            help="bytes a step may reserve (80GiB; default: the GPU's free memory, if one is here)",
        )
        parser.add_argument(
            "--precision", choices=PRECISIONS, default="as given", help="the baseline's"
        )
        parser.add_argument(
            "--checkpointing",
            action="store_true",
            help="the baseline checkpoints its repeated blocks",
        )
        parser.add_argument(
            "--optimizer",
            choices=tuple(OPTIMIZERS),
            help="the baseline's (default: the factory's, else adamw)",
        )
        parser.add_argument(
            "--sizes",
            type=int,
            nargs="*",
            metavar="N",
            help="sizes to try (default: half and twice)",
        )
        parser.add_argument(
            "--precisions", choices=PRECISIONS, nargs="*", metavar="P",
            help=f"precisions to try, of: {', '.join(PRECISIONS)} (default: bf16 amp-bf16)",
        )  # fmt: skip
        parser.add_argument(
            "--optimizers", choices=tuple(OPTIMIZERS), nargs="*", metavar="NAME",
            help=f"optimizers to try, of: {', '.join(OPTIMIZERS)} "
                 "(default: sgd-momentum adamw-fused)",
        )  # fmt: skip
        parser.add_argument(
            "--no-checkpointing-row", action="store_true", help="do not try checkpointing flipped"
        )
        parser.add_argument("--no-search", action="store_true", help="no largest size that fits")
        parser.add_argument(
            "--world-size", type=int, default=1, metavar="N",
            help="ranks of data parallelism: every figure is one rank's (default 1)",
        )  # fmt: skip
        parser.add_argument(
            "--parallel", choices=PARALLEL_MODES,
            help="the baseline's data-parallel mode (needed with --world-size above 1; the "
                 "other mode is tried too)",
        )  # fmt: skip
        parser.add_argument(
            "--limit", type=int, default=1 << 16, help="the largest size searched (default 65536)"
        )
        parser.add_argument(
            "--no-measure-kernels", action="store_true",
            help="run no convolution on the device to measure its workspace (they are then "
                 "not counted)",
        )  # fmt: skip
        _arguments.format_argument(parser, ("text", "json"))
        parser.add_argument(
            "--save", metavar="FILE", help="also save the plan (memlab-rs show reads it)"
        )

    def run(self, args: argparse.Namespace) -> int:
        import torch

        from .. import plan
        from . import _output

        with _cwd_on_path():  # as `python -m` finds the user's modules, while they load
            workload = _workload(_factory(args.factory), args.factory)
        kwargs: dict[str, Any] | None
        if args.optimizer is not None:
            optimizer, kwargs = _optimizer(args.optimizer)
        else:
            optimizer = workload.get("optimizer", torch.optim.AdamW)
            kwargs = workload.get("optimizer_kwargs")
        optimizers = None
        if args.optimizers is not None:
            optimizers = {name: _optimizer_factory(name) for name in args.optimizers}
        result = plan(
            workload["model"],
            workload["make_inputs"],
            args.size if args.size is not None else workload.get("size", 8),
            args.budget,
            size_name=args.size_name,
            make_targets=workload.get("make_targets"),
            loss_fn=workload.get("loss_fn"),
            optimizer=optimizer,
            optimizer_kwargs=kwargs,
            precision=args.precision,
            checkpointing=args.checkpointing,
            device=args.device,
            sizes=args.sizes,
            precisions=args.precisions,
            optimizers=optimizers,
            try_checkpointing=not args.no_checkpointing_row,
            search=not args.no_search,
            limit=args.limit,
            world_size=args.world_size,
            parallel=args.parallel,
            measure_kernels=not args.no_measure_kernels,
        )
        if args.save:
            result.save(args.save)
        _output.write(_output.formatted(result, args.format, {}))
        return 0


@contextlib.contextmanager
def _cwd_on_path() -> Iterator[None]:
    added = "" not in sys.path and os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        yield
    finally:
        if added and os.getcwd() in sys.path:
            sys.path.remove(os.getcwd())


def _factory(spec: str) -> Any:
    """The function ``module:factory`` names (the module imported from the current
    directory, or loaded from a ``.py`` path)."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise CliError(
            f"{spec!r}: give the factory as module:function (models.py:make or pkg.models:make)"
        )
    if module_name.endswith(".py") or os.sep in module_name:
        if not os.path.isfile(module_name):
            raise CliError(f"{module_name}: no such file")
        name = os.path.splitext(os.path.basename(module_name))[0]
        loader = importlib.util.spec_from_file_location(name, module_name)
        if loader is None or loader.loader is None:
            raise CliError(f"{module_name}: not a Python file")
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module
        loader.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name and module_name.startswith(error.name):
                raise CliError(
                    f"no module named {module_name!r} (from the current directory)"
                ) from None
            raise
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise CliError(f"{spec!r}: {module_name} has no function {attr!r}")
    return factory


def _workload(factory: Any, spec: str) -> dict[str, Any]:
    """What the factory returns, as a dict with ``model`` and ``make_inputs``."""
    made = factory()
    if isinstance(made, tuple) and len(made) == 2:
        made = {"model": made[0], "make_inputs": made[1]}
    if not isinstance(made, dict) or "model" not in made or "make_inputs" not in made:
        raise CliError(
            f"{spec} must return (model, make_inputs) or a dict with 'model' and 'make_inputs', "
            f"got {type(made).__name__}"
        )
    known = {
        "model",
        "make_inputs",
        "make_targets",
        "loss_fn",
        "optimizer",
        "optimizer_kwargs",
        "size",
    }
    unknown = sorted(set(made) - known)
    if unknown:
        raise CliError(f"{spec} returned keys this command does not know: {', '.join(unknown)}")
    return made


def _optimizer(name: str) -> tuple[Any, dict[str, Any]]:
    import torch

    cls, kwargs = OPTIMIZERS[name]
    return getattr(torch.optim, cls), dict(kwargs)


def _optimizer_factory(name: str) -> Any:
    cls, kwargs = _optimizer(name)

    def make(params: Any) -> Any:
        return cls(params, **kwargs)

    make.__name__ = name
    return make
