"""The tensor report as data (kind ``tensor_report``): ``MemoryReport``, what
``MemReporter.collect()`` returns and a ``tensor_report`` file holds, and ``TensorRow``, one
of its rows. The report's data is the serde struct of ``src/tensor_report/result.rs``, held
as the JSON text Rust wrote; ``_core.tensor_report`` checks and renders it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Union

import torch

from .. import _core, _torch, results

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


class MemoryReport(results.Result):
    """The result of ``MemReporter.collect()``: plain data, no reference to any tensor.

    Prints as pytorch_memlab's table, renders as HTML in Jupyter, exports to JSON and pandas,
    and saves as a ``tensor_report`` result file (``save``; ``memlab_rs.load`` reads it
    back, rendering exactly the same).

    ``table`` is the report's data, as ``to_data()`` gives it (a dict, or its JSON text);
    ``verbose`` is the default of ``to_text()``, ``meta`` where and when it was made.

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
    _rust = _core.tensor_report
    _formats = ("text", "html", "json")

    def __init__(self, table: Any, verbose: bool = False, meta: dict[str, Any] | None = None):
        if isinstance(table, str):
            data = json.loads(table)
        elif isinstance(table, dict):
            data = dict(table)
        else:
            raise TypeError(
                "table must be a tensor report's data (MemoryReport.to_data()) or its JSON "
                f"text, got {type(table).__name__}"
            )
        if not isinstance(data, dict):
            raise ValueError(f"table must be a JSON object, got {type(data).__name__}")
        data["verbose"] = bool(verbose)
        # meta: where and when the report was made (``results.run_meta``); its ``device`` is
        # the device asked for, None when the report covers every device.
        self._set_data(data, results.run_meta(None) if meta is None else meta)

    @property
    def verbose(self) -> bool:
        """The default of ``to_text()``: ``name(->owner)`` for a row sharing a storage."""
        return bool(self.to_data()["verbose"])

    @property
    def incomplete(self) -> str | None:
        """Why the report may miss tensors (None when it does not): a walk made during a
        garbage collection, or frozen objects that could not be searched."""
        return self.to_data()["incomplete"]

    @property
    def devices(self) -> list[str]:
        """Devices in report order."""
        return [s["device"] for s in self.to_data()["sections"]]

    @property
    def rows(self) -> list[TensorRow]:
        """Every row, device by device."""
        return [
            TensorRow(
                name=r["name"],
                device=r["device"],
                shape=r["shape_text"] if r["shape"] is None else tuple(r["shape"]),
                dtype=r["dtype"],
                numel=r["numel"],
                bytes=r["bytes"],
                storage_bytes=r["storage_bytes"],
                shared_with=r["shared_with"],
            )
            for s in self.to_data()["sections"]
            for r in s["rows"]
        ]

    def sections(self) -> list[dict]:
        """Per-device totals: bytes, numel, and on CUDA the allocator's figures and the
        remainder split into ``unseen_tensors`` and ``rounding``."""
        found = json.loads(self._rust.sections(self._json))
        for section in found:
            if section.get("driver_used_total") is not None:
                section["driver_used_total"] = tuple(section["driver_used_total"])
        return found

    def total_bytes(self, device: DeviceLike) -> int:
        """Bytes charged to the tensors listed on ``device`` (0 if none)."""
        key = _torch.device_key(device)
        sections = self.to_data()["sections"]
        return next((int(s["total_bytes"]) for s in sections if s["device"] == key), 0)

    def to_text(self, verbose: bool | None = None) -> str:
        """pytorch_memlab's table as a string (under a line naming the rank, for a report
        made in a job of several processes)."""
        return self.render("text", verbose=bool(self.verbose if verbose is None else verbose))

    def to_json(self, path: str | None = None) -> str:
        """The report as JSON (also written to ``path`` when given)."""
        return results.write_text(self.render("json"), path)

    def to_dict(self) -> dict:
        """The report as nested dicts and lists (the JSON document, parsed)."""
        return json.loads(self.render("json"))

    def to_dataframe(self):
        """The rows as a pandas DataFrame (``pip install memlab_rs[pandas]``)."""
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError(
                "MemoryReport.to_dataframe() needs pandas: pip install 'memlab_rs[pandas]'"
            ) from e
        return pd.DataFrame(columns(self.to_data()))

    def text(self, verbose: bool | None = None) -> str:
        """The same as ``to_text``: the name every result's text has."""
        return self.to_text(verbose)

    def html(self) -> str:
        """The table as HTML (Jupyter's display), under the rank's heading in a job of
        several processes."""
        return self.render("html")

    def to_data(self) -> dict[str, Any]:
        """The report as JSON values (a saved file's ``data``): ``verbose``, ``sections``
        (rows, totals, omitted rows, CUDA figures), ``incomplete`` and ``walk``."""
        return super().to_data()

    # data_json and render are the base's, restated in the base's order so that the API
    # reference (docs/gen_api.py lists a class's own members first) keeps its place for them.

    def data_json(self) -> str:
        return super().data_json()

    def render(self, format: str = "text", **view: Any) -> str:
        # The text and the HTML of a report made in a job of several processes start with a
        # line naming its rank: what to_text() and html() give, and memlab-rs show prints.
        rendered = super().render(format, **view)
        heading = results.rank_heading(self.meta)
        if heading is None or format == "json":
            return rendered
        if format == "html":
            from html import escape

            return f"<p><b>{escape(heading)}</b></p>\n{rendered}"
        return f"# {heading}\n\n{rendered}"


def columns(data: dict[str, Any]) -> dict[str, Any]:
    """A report's rows as columns: lists for text (``shape`` a tuple, or the text of a
    symbolic one), NumPy int64 arrays for numbers."""
    import numpy as np

    rows = [r for s in data["sections"] for r in s["rows"]]
    return {
        "name": [r["name"] for r in rows],
        "device": [r["device"] for r in rows],
        "shape": [r["shape_text"] if r["shape"] is None else tuple(r["shape"]) for r in rows],
        "dtype": [r["dtype"] for r in rows],
        "numel": np.array([r["numel"] for r in rows], dtype=np.int64),
        "bytes": np.array([r["bytes"] for r in rows], dtype=np.int64),
        "storage_bytes": np.array([r["storage_bytes"] for r in rows], dtype=np.int64),
        "shared_with": [r["shared_with"] for r in rows],
    }


results.register(MemoryReport.kind, MemoryReport.from_data)
