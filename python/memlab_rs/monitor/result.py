"""The training monitor's record as data: what ``MemoryMonitor.result()`` returns and
``load()`` rebuilds.

It holds one row per recorded iteration (``rows()``: bytes per figure and category), what
each printed block needs besides (feature maps per module, the parameter rows' names,
bytes and gradient bytes), the device, the print period and the CSV header's names. The
record is the serde struct of ``src/monitor/result.rs``; the printed block, the CSV and the
HTML plot are rendered from it by ``_core.monitor.render``, the PNG plot and the data frame
from its rows. The live monitor prints from the same record (``_core.monitor.Recorder``),
so a saved result renders as the monitor printed.

>>> import io, torch, memlab_rs
>>> model = torch.nn.Linear(1000, 500)
>>> with memlab_rs.memory_profiler(model, file=io.StringIO()) as monitor:
...     model(torch.randn(8, 1000, requires_grad=True)).sum().backward()
...     monitor.record_stats()
>>> result = monitor.result()
>>> result.rows()[0]["weight_usage"]
2002000
>>> memlab_rs.results.loads(memlab_rs.results.dumps(result)).text() == monitor.text()
True
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from .. import _core, results
from .plot import dataframe, plot_png

#: One record's details: (feature maps per module, row names, row bytes, row gradient bytes).
Details = tuple[list[tuple[str, int]], Any, list[int], list[int]]


class MonitorResult(results.SavedResult):
    """A training monitor's record: per-iteration rows and what their blocks print."""

    kind = "monitor"
    _rust = _core.monitor
    _formats = ("text", "csv", "html")

    def __init__(
        self,
        device: str,
        verbose: bool,
        print_period: int,
        csv_names: list[str],
        records: list[dict[str, Any]],
        details: list[Details],
        meta: dict[str, Any] | None = None,
    ):
        # Parameter rows change rarely: each distinct (names, bytes) is saved once.
        layouts: list[dict[str, Any]] = []
        index: dict[tuple[tuple[str, ...], tuple[int, ...]], int] = {}
        saved_details = []
        for modules, names, nbytes, grads in details:
            key = (tuple(names), tuple(nbytes))
            if key not in index:
                index[key] = len(layouts)
                layouts.append({"names": list(key[0]), "bytes": list(key[1])})
            saved_details.append(
                {"modules": [list(m) for m in modules], "layout": index[key], "grads": grads}
            )
        data = {
            "device": device,
            "verbose": verbose,
            "print_period": print_period,
            "csv_names": list(csv_names),
            "rows": records,
            "layouts": layouts,
            "details": saved_details,
        }
        self._set_data(data, results.run_meta(device) if meta is None else meta)

    @property
    def device(self) -> str:
        """The device monitored: ``"cpu"`` or ``"cuda:N"``."""
        return str(self.to_data()["device"])

    @property
    def verbose(self) -> bool:
        """Whether the blocks list the feature maps per module."""
        return bool(self.to_data()["verbose"])

    @property
    def print_period(self) -> int:
        """A block was printed every ``print_period``-th iteration of an epoch."""
        return int(self.to_data()["print_period"])

    @property
    def csv_names(self) -> list[str]:
        """The parameter rows' names in the CSV header (the model's when the monitor began)."""
        return list(self.to_data()["csv_names"])

    # ----- renderings -------------------------------------------------------------------

    def rows(self) -> list[dict[str, Any]]:
        """One plain dict per recorded iteration (bytes; keys in docs/guide.md)."""
        return [dict(r) for r in self.to_data()["rows"]]

    def to_dataframe(self) -> Any:
        """The rows as a pandas DataFrame (needs pandas)."""
        return dataframe(self.rows())

    def text(self, iteration: int | None = None) -> str:
        """The original's block for one recorded iteration: ``iteration`` is the ``step``
        of a row (1, 2, ... over the monitor's life); None means the latest."""
        return rendered(self._render, "text", "text", iteration=iteration)

    def csv_header(self) -> str:
        """The CSV file's header line, in the original's column order."""
        return self.render("csv", header=True)

    def csv_row(self, iteration: int | None = None) -> str:
        """The CSV line of one recorded iteration (a row's ``step``; None: the latest)."""
        if iteration is None:
            iteration = len(self.to_data()["rows"])
            if not iteration:
                raise ValueError("csv_row(): nothing recorded yet; call record_stats() first")
        return rendered(self._render, "csv_row", "csv", iteration=iteration)

    def printed_steps(self) -> list[int]:
        """The steps whose block was printed (and CSV row written): every
        ``print_period``-th iteration of each epoch."""
        period = self.print_period
        return [r["step"] for r in self.to_data()["rows"] if r["iteration"] % period == 0]

    def to_csv(self, path: str | os.PathLike[str] | None = None) -> str:
        """The CSV the monitor writes with ``csv=True``: the header, then the printed
        iterations' rows (also written to ``path`` when given)."""
        return results.write_text(self.render("csv"), path)

    def plot_html(self) -> str:
        """Memory per iteration by category as one self-contained HTML fragment."""
        return self.render("html")

    def _repr_html_(self) -> str:
        return self.plot_html()

    def __str__(self) -> str:
        return self.text() if self.to_data()["rows"] else "<MonitorResult: nothing recorded>"

    __repr__ = __str__

    def plot_png(self, path: str | os.PathLike[str]) -> None:
        """Save memory per iteration by category (stacked bars, MB) as a PNG (needs
        matplotlib)."""
        plot_png(self.rows(), self.device, path)

    # ----- saved form -------------------------------------------------------------------

    def to_data(self) -> dict[str, Any]:
        """The result as JSON values (a saved file's ``data``). Parameter rows change
        rarely, so their names and bytes are saved once per layout (``layouts``) and each
        record's ``details`` name its layout by index."""
        data: dict[str, Any] = super().to_data()
        return data

    def _render(self, format: str, view: str) -> str:
        return str(self._rust.render(self._json, format, view))


def rendered(render: Callable[[str, str], str], what: str, format: str, **view: Any) -> str:
    """``render(format, view_json)`` (a result's or the live monitor's record), the options
    left at None left out; a ValueError says which call it was (``text(): ...``)."""
    options = {name: value for name, value in view.items() if value is not None}
    try:
        return render(format, json.dumps(options))
    except ValueError as error:
        raise ValueError(f"{what}(): {error}") from None


results.register("monitor", MonitorResult.from_data)
