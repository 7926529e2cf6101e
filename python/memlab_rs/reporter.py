"""MemReporter: every tensor Python can reach, by device, each storage counted once.

A drop-in for ``pytorch_memlab.MemReporter`` with correct numbers. The walk, the storage
dedup and the rendering run in Rust (``memlab_rs._core``); this module gathers names from
the model and optimizers and the CUDA allocator's figures.
"""

from __future__ import annotations

import json
import operator
import weakref
from dataclasses import dataclass
from typing import Any, Union

import torch

from . import _args, _core, _torch, results

DeviceLike = Union[torch.device, str, int]


@dataclass(frozen=True)
class TensorRow:
    """One row of a report: a tensor, or one part of a sparse tensor."""

    name: str
    device: str
    shape: tuple | str
    dtype: str
    numel: int
    #: Bytes charged to this row: the storage as allocated (CUDA rounds up to 512 bytes),
    #: or 0 when another row already owns the storage.
    bytes: int
    #: The storage's own size, before allocator rounding.
    storage_bytes: int
    #: Name of the row that owns the shared storage, if any.
    shared_with: str | None


class MemoryReport(results.SavedResult):
    """The result of ``MemReporter.collect()``: plain data, no reference to any tensor.

    Prints as pytorch_memlab's table, renders as HTML in Jupyter, exports to JSON and pandas,
    and saves as a ``tensor_report`` result file (``save``; ``memlab_rs.load`` reads it
    back, rendering exactly the same).

    >>> import os, tempfile, torch, memlab_rs
    >>> w = torch.zeros(256, 1024)
    >>> report = memlab_rs.MemReporter().collect(device="cpu")
    >>> report.total_bytes("cpu") >= 1 << 20
    True
    >>> path = os.path.join(tempfile.mkdtemp(), "report.json")
    >>> report.save(path)
    >>> memlab_rs.load(path).to_text() == report.to_text()
    True
    """

    kind = "tensor_report"

    def __init__(self, table: Any, verbose: bool = False, meta: dict[str, Any] | None = None):
        self._table = table
        self.verbose = verbose
        #: Where and when the report was made (``results.run_meta``); ``device`` is the
        #: device asked for, None when the report covers every device.
        self.meta = results.run_meta(None) if meta is None else meta

    @property
    def devices(self) -> list[str]:
        """Devices in report order."""
        return self._table.devices()

    @property
    def rows(self) -> list[TensorRow]:
        """Every row, device by device."""
        cols = self._table.columns()
        rows = []
        for i in range(len(cols["name"])):
            fields: dict[str, Any] = {key: cols[key][i] for key in _ROW_FIELDS}
            for key in _INT_COLUMNS:
                fields[key] = int(fields[key])
            rows.append(TensorRow(**fields))
        return rows

    def sections(self) -> list[dict]:
        """Per-device totals: bytes, numel, and on CUDA the allocator's figures and the
        remainder split into ``unseen_tensors`` and ``rounding``."""
        return self._table.sections()

    def total_bytes(self, device: DeviceLike) -> int:
        """Bytes charged to the tensors listed on ``device`` (0 if none)."""
        key = _torch.device_key(device)
        return next((s["total_bytes"] for s in self.sections() if s["device"] == key), 0)

    def to_text(self, verbose: bool | None = None) -> str:
        """pytorch_memlab's table as a string (under a line naming the rank, for a report
        made in a job of several processes)."""
        text = self._table.text(bool(self.verbose if verbose is None else verbose))
        heading = results.rank_heading(self.meta)
        return text if heading is None else f"# {heading}\n\n{text}"

    def to_json(self, path: str | None = None) -> str:
        """The report as JSON (also written to ``path`` when given)."""
        return results.write_text(self._table.json(), path)

    def to_dict(self) -> dict:
        """The report as nested dicts and lists (the JSON document, parsed)."""
        return json.loads(self._table.json())

    def to_dataframe(self):
        """The rows as a pandas DataFrame (``pip install memlab_rs[pandas]``)."""
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError(
                "MemoryReport.to_dataframe() needs pandas: pip install 'memlab_rs[pandas]'"
            ) from e
        return pd.DataFrame(self._table.columns())

    def text(self, verbose: bool | None = None) -> str:
        """The same as ``to_text``: the name every result's text has."""
        return self.to_text(verbose)

    def html(self) -> str:
        """The table as HTML (Jupyter's display), under the rank's heading in a job of
        several processes."""
        html = self._table.html()
        heading = results.rank_heading(self.meta)
        if heading is None:
            return html
        from html import escape

        return f"<p><b>{escape(heading)}</b></p>\n{html}"

    def to_data(self) -> dict[str, Any]:
        """The report as JSON values (a saved file's ``data``): ``verbose``, ``sections``
        (rows, totals, omitted rows, CUDA figures), ``incomplete`` and ``walk``."""
        return {"verbose": self.verbose, **self._table.data()}

    @classmethod
    def from_data(cls, data: dict[str, Any], meta: dict[str, Any]) -> MemoryReport:
        """The report from a saved file's ``data`` and ``meta`` (checked by ``load``
        against ``_result_schema.TENSOR_REPORT``)."""
        return cls(_core.ReportTable.from_data(data), verbose=data["verbose"], meta=meta)


results.register("tensor_report", MemoryReport.from_data)

_ROW_FIELDS = ("name", "device", "shape", "dtype", "numel", "bytes", "storage_bytes", "shared_with")
_INT_COLUMNS = ("numel", "bytes", "storage_bytes")


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
        self._collected: Any = None  # the table of the last collect_tensor(), not yet used
        self._stats: Any = None  # the table get_stats() or report() turned into stats
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

    def _table(self) -> Any:
        """Walk now: every device, CUDA figures added, no view applied."""
        table = _core.collect_report(self._named_tensors(), self.pre_collect)
        cuda_devices = [d for d in table.devices() if d.startswith("cuda")]
        cuda_devices += [d for d in _torch.cuda_devices_with_memory() if d not in cuda_devices]
        for dev in cuda_devices:
            table = table.with_cuda(dev, *_torch.cuda_allocator_figures(dev))
        return table

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
        table = self._table().view(wanted, sort_by, top)
        meta = results.run_meta(wanted[0] if wanted else None)
        return MemoryReport(table, verbose=bool(verbose), meta=meta)

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
        shown = table.view(wanted, sort_by, top)  # checks sort_by before anything is kept
        self._collected = None
        self._use_stats(table)
        print(shown.text(bool(verbose)), end="")

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
        print(self._stats.view(wanted, None, None).text(bool(verbose)), end="")

    def _use_stats(self, table: Any) -> None:
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


def _device_tensor_stat(table: Any) -> dict[torch.device, list[tuple[str, Any, int, int]]]:
    """pytorch_memlab's per-device ``(name, size, numel, memory)`` lists from a table."""
    out: dict[torch.device, list[tuple[str, Any, int, int]]] = {}
    if table is None:
        return out
    cols = table.columns()
    for i, name in enumerate(cols["name"]):
        shape = cols["shape"][i]
        if shape == ():
            shape = (1,)
        owner = cols["shared_with"][i]
        label = name if owner is None else f"{name}(->{owner})"
        stat = (label, shape, int(cols["numel"][i]), int(cols["bytes"][i]))
        out.setdefault(torch.device(cols["device"][i]), []).append(stat)
    return out
