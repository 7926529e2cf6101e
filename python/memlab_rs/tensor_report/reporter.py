"""MemReporter: every tensor Python can reach, by device, each storage counted once.

A drop-in for ``pytorch_memlab.MemReporter`` with correct numbers. The walk, the storage
dedup, the views and the rendering run in Rust (``_core.tensor_report``); this module gathers
names from the model and optimizers and the CUDA allocator's figures, and hands the report
over as data (``MemoryReport``).
"""

from __future__ import annotations

import json
import operator
import weakref
from typing import Any

import torch

from .. import _args, _core, _torch, results
from .result import DeviceLike, MemoryReport


class MemReporter:
    """Report every tensor Python can reach, by device, each storage counted once.

    Drop-in for ``pytorch_memlab.MemReporter``: same constructor, ``report()``,
    ``add_optimizer()``, ``collect_tensor()``, ``get_stats()``, ``print_stats()`` and
    ``device_tensor_stat``, same printed layout. Differences (all fixes): used memory is the
    storage's real size (pytorch_memlab multiplies it by the element size again), tied and
    shared storages are counted once, and on CUDA the report accounts for the whole of
    ``torch.cuda.memory_allocated()``.

    Names are taken from the model when the reporter is built, as pytorch_memlab does, so a
    container that is not kept elsewhere (``MemReporter(nn.ModuleDict({...}))``) still names
    its parameters; while the model lives, its current names are used (parameters added
    later are named too). Only weak references are kept: the reporter keeps no tensor,
    model or optimizer alive.

    >>> import torch, memlab_rs
    >>> linear = torch.nn.Linear(1024, 1024)
    >>> reporter = memlab_rs.MemReporter(linear)
    >>> [r.bytes for r in reporter.collect(device="cpu").rows if r.name == "weight"]
    [4194304]
    """

    def __init__(self, model: torch.nn.Module | None = None, pre_collect: bool = False):
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"MemReporter(model=...) expects a torch.nn.Module, got {type(model).__name__}; "
                "pass the module whose parameters you want named, or nothing"
            )
        self._model = None if model is None else weakref.ref(model)
        # The names at construction, weakly: they outlive a model nobody else keeps.
        self._names_at_start = [] if model is None else _weak_names(model)
        self._optimizers: list[weakref.ref] = []
        self.pre_collect = pre_collect
        # pytorch_memlab's three-step API: collect_tensor() -> get_stats() -> print_stats().
        # The report data (JSON) of the last collect_tensor(), not yet used, and the one
        # get_stats() or report() turned into stats.
        self._collected: str | None = None
        self._stats: str | None = None
        self._device_tensor_stat: dict | None = {}

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Name the optimizer's state after its parameters: ``Adam.weight.exp_avg``.

        >>> import torch, memlab_rs
        >>> lin = torch.nn.Linear(4, 4)
        >>> opt = torch.optim.Adam(lin.parameters())
        >>> memlab_rs.MemReporter(lin).add_optimizer(opt)
        """
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"add_optimizer() expects a torch.optim.Optimizer, got {type(optimizer).__name__}"
            )
        if all(ref() is not optimizer for ref in self._optimizers):
            self._optimizers.append(weakref.ref(optimizer))

    def _named_tensors(self) -> list[tuple[torch.Tensor, str]]:
        named: list[tuple[torch.Tensor, str]] = []
        model = self._model() if self._model is not None else None
        if model is not None:
            named.extend(_torch.module_tensor_names(model))
        else:
            for ref, name in self._names_at_start:
                tensor = ref()
                if tensor is not None:
                    named.append((tensor, name))
        param_names = {id(t): name for t, name in named}
        for ref in self._optimizers:
            optimizer = ref()
            if optimizer is not None:
                named.extend(_torch.optimizer_tensor_names(optimizer, param_names))
        return named

    def _table(self) -> str:
        """Walk now: the report's data (JSON) of every device, CUDA figures added, no view
        applied."""
        data, cuda_devices = _core.tensor_report.collect(self._named_tensors(), self.pre_collect)
        cuda_devices += [d for d in _torch.cuda_devices_with_memory() if d not in cuda_devices]
        if cuda_devices:
            figures = [
                (d, *_torch.cuda_allocator_figures(d), _allocator_state(d)) for d in cuda_devices
            ]
            data = _core.tensor_report.with_cuda(data, figures)
        return data

    def collect(
        self,
        device: DeviceLike | None = None,
        sort_by: str | None = None,
        top: int | None = None,
        verbose: bool = False,
    ) -> MemoryReport:
        """Walk every tensor now and return the report as data (nothing is printed).

        ``device`` keeps one device (a bare ``"cuda"`` means the current one); ``sort_by``
        is None (the order found: the model's tensors first), ``"size"`` or ``"name"``;
        ``top`` keeps the first N rows per device (any integer-like value), totals still
        covering every tensor; ``verbose`` is read as a truth value.
        """
        wanted, top = _view_arguments(device, top, sort_by=sort_by)
        data = _core.tensor_report.view(self._table(), wanted, sort_by, top, bool(verbose))
        meta = results.run_meta(wanted[0] if wanted else None)
        return MemoryReport._from_json(data, meta)

    def report(
        self,
        verbose: bool = False,
        device: DeviceLike | None = None,
        sort_by: str | None = None,
        top: int | None = None,
    ) -> None:
        """Print the table, as pytorch_memlab does; see ``collect()`` for the arguments.

        Like pytorch_memlab's, it also leaves the stats in ``device_tensor_stat``.

        >>> import torch, memlab_rs
        >>> model = torch.nn.Linear(2, 2)
        >>> memlab_rs.MemReporter(model).report(device="cpu", top=1)
        Element type                                            Size  Used MEM
        -------------------------------------------------------------------------------
        Storage on cpu
        weight                                                (2, 2)    16.00B
        ...
        """
        wanted, top = _view_arguments(device, top, sort_by=sort_by)
        table = self._table()
        # checks sort_by before anything is kept
        shown = _core.tensor_report.view(table, wanted, sort_by, top, bool(verbose))
        self._collected = None
        self._use_stats(table)
        print(_text(shown), end="")

    def collect_tensor(self) -> None:
        """pytorch_memlab's first step: find every tensor now (``get_stats()`` turns them
        into ``device_tensor_stat``). What it keeps is plain data: no tensor stays alive.

        >>> import torch, memlab_rs
        >>> lin = torch.nn.Linear(2, 2)
        >>> reporter = memlab_rs.MemReporter(lin)
        >>> reporter.collect_tensor(); reporter.get_stats()
        >>> reporter.device_tensor_stat[torch.device("cpu")][:2]
        [('weight', (2, 2), 4, 16), ('bias', (2,), 2, 8)]
        """
        self._collected = self._table()

    def get_stats(self) -> None:
        """pytorch_memlab's second step: turn what ``collect_tensor()`` found into
        ``device_tensor_stat`` (empty if nothing was collected since the last call)."""
        table, self._collected = self._collected, None
        self._use_stats(table)

    @property
    def device_tensor_stat(self) -> dict[torch.device, list[tuple[str, Any, int, int]]]:
        """pytorch_memlab's stats of the last ``get_stats()`` or ``report()``: per
        ``torch.device``, one ``(name, size, numel, memory)`` tuple per row, as
        pytorch_memlab builds them (``name(->owner)`` for a shared storage, ``(1,)`` for a
        scalar), with this report's exact bytes."""
        if self._device_tensor_stat is None:
            self._device_tensor_stat = _device_tensor_stat(self._stats)
        return self._device_tensor_stat

    @device_tensor_stat.setter
    def device_tensor_stat(self, value: dict) -> None:
        self._device_tensor_stat = value

    def print_stats(self, verbose: bool = False, target_device: DeviceLike | None = None) -> None:
        """pytorch_memlab's third step: print the table of the last ``get_stats()`` (only
        ``target_device`` when given)."""
        wanted, _ = _view_arguments(target_device, None, name="target_device")
        if self._stats is None:
            print(_HEADER)
            return
        shown = _core.tensor_report.view(self._stats, wanted, None, None, bool(verbose))
        print(_text(shown), end="")

    def _use_stats(self, table: str | None) -> None:
        self._stats = table
        self._device_tensor_stat = None if table is not None else {}

    def to_json(self, device: DeviceLike | None = None) -> str:
        """A fresh report as JSON."""
        return self.collect(device).to_json()

    def to_dataframe(self, device: DeviceLike | None = None):
        """A fresh report as a pandas DataFrame."""
        return self.collect(device).to_dataframe()

    def _repr_html_(self) -> str:
        return self.collect().html()


_HEADER = "Element type                                            Size  Used MEM"


def _allocator_state(device: str) -> str | None:
    """The allocator's segments of `device` as the fragmentation floor reads them (JSON),
    or None when torch cannot give them (another allocator backend)."""
    try:
        return json.dumps(_torch.cuda_allocator_state(int(device.split(":")[1])))
    except RuntimeError:  # not torch's caching allocator: no segments to read
        return None


def _text(data: str) -> str:
    """pytorch_memlab's table of a report's data, as ``report()`` prints it."""
    return _core.tensor_report.render(data, "text", "{}")


def _weak_names(model: torch.nn.Module) -> list[tuple[weakref.ref, str]]:
    """The model's (tensor, name) pairs, each tensor held by a weak reference."""
    out = []
    for tensor, name in _torch.module_tensor_names(model):
        try:
            out.append((weakref.ref(tensor), name))
        except TypeError:  # a tensor type without weak references: named while alive only
            continue
    return out


def _view_arguments(
    device: Any, top: Any, name: str = "device", sort_by: Any = None
) -> tuple[list[str] | None, int | None]:
    """Check ``device``, ``top`` and ``sort_by``'s type as Python code passes them
    (np.int64, truthy values); the core checks ``sort_by``'s value."""
    wanted = None if device is None else [_torch.report_device(device, name)]
    if top is not None:
        if isinstance(top, bool):
            raise TypeError(f"top must be a number of rows (an int >= 0) or None, got {top!r}")
        try:
            top = operator.index(top)
        except TypeError:
            raise TypeError(
                f"top must be a number of rows (an int >= 0) or None, got {top!r} "
                f"({type(top).__name__})"
            ) from None
        if top < 0:
            raise ValueError(f"top must be a non-negative int or None, got {top}")
        if top > _args.MAX_COUNT:
            raise ValueError(
                f"top must be at most 2**63 - 1 rows (None for every row), got "
                f"{_args.shown(top)}"
            )
    if sort_by is not None and not isinstance(sort_by, str):
        raise TypeError(
            f"sort_by must be None, 'size' or 'name', got {_args.shown(sort_by)} "
            f"({type(sort_by).__name__})"
        )
    return wanted, top


def _device_tensor_stat(table: str | None) -> dict[torch.device, list[tuple[str, Any, int, int]]]:
    """pytorch_memlab's per-device ``(name, size, numel, memory)`` lists from a report's
    data."""
    out: dict[torch.device, list[tuple[str, Any, int, int]]] = {}
    if table is None:
        return out
    for section in json.loads(table)["sections"]:
        for row in section["rows"]:
            shape: Any = row["shape_text"] if row["shape"] is None else tuple(row["shape"])
            if shape == ():
                shape = (1,)
            owner = row["shared_with"]
            label = row["name"] if owner is None else f"{row['name']}(->{owner})"
            stat = (label, shape, int(row["numel"]), int(row["bytes"]))
            out.setdefault(torch.device(row["device"]), []).append(stat)
    return out
