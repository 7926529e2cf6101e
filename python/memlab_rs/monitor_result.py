"""The training monitor's record as data: what ``MemoryMonitor.result()`` returns and
``load()`` rebuilds.

It holds one row per recorded iteration (``rows()``: bytes per figure and category), what
each printed block needs besides (feature maps per module, the parameter rows' names,
bytes and gradient bytes), the device, the print period and the CSV header's names. The
printed block, the CSV, the HTML plot, the PNG plot and the data frame are rendered from
it; the live monitor renders through its own (``MemoryMonitor._result``), so a saved
result renders as the monitor printed.

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

import os
from typing import Any

from . import _args, _core, results
from ._categories import CATEGORIES

#: One record's details: (feature maps per module, row names, row bytes, row gradient bytes).
Details = tuple[list[tuple[str, int]], Any, list[int], list[int]]


class MonitorResult(results.SavedResult):
    """A training monitor's record: per-iteration rows and what their blocks print."""

    kind = "monitor"

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
        self._device = device
        self.verbose = verbose
        self.print_period = print_period
        #: The parameter rows' names in the CSV header (the model's when the monitor began).
        self.csv_names = list(csv_names)
        # Shared with the live monitor, which appends to both: its renderings are ours.
        self._records = records
        self._details = details
        self.meta = results.run_meta(device) if meta is None else meta

    @property
    def device(self) -> str:
        """The device monitored: ``"cpu"`` or ``"cuda:N"``."""
        return self._device

    def _snapshot(self, meta: dict[str, Any]) -> MonitorResult:
        """A copy that later records leave as it is."""
        return MonitorResult(
            self._device,
            self.verbose,
            self.print_period,
            self.csv_names,
            [dict(r) for r in self._records],
            list(self._details),
            meta,
        )

    # ----- renderings -------------------------------------------------------------------

    def rows(self) -> list[dict[str, Any]]:
        """One plain dict per recorded iteration (bytes; keys in docs/guide.md)."""
        return [dict(r) for r in self._records]

    def to_dataframe(self) -> Any:
        """The rows as a pandas DataFrame (needs pandas)."""
        try:
            import pandas
        except ImportError:
            raise ImportError("to_dataframe() needs pandas: pip install pandas") from None
        return pandas.DataFrame(self.rows())

    def _index(self, step: int | None, what: str) -> int:
        if not self._records:
            raise ValueError(f"{what}(): nothing recorded yet; call record_stats() first")
        if step is None:
            return len(self._records) - 1
        if isinstance(step, int) and not isinstance(step, bool):
            if 1 <= step <= len(self._records):
                return step - 1
        raise ValueError(
            f"{what}(iteration={step!r}): steps recorded are 1 to {len(self._records)}"
        )

    def text(self, iteration: int | None = None) -> str:
        """The original's block for one recorded iteration: ``iteration`` is the ``step``
        of a row (1, 2, ... over the monitor's life); None means the latest."""
        index = self._index(iteration, "text")
        r = self._records[index]
        modules, names, nbytes, grads = self._details[index]
        return _core._monitor_text(
            _figures(r), modules if self.verbose else [], names, nbytes, grads, r["notice"]
        )

    def csv_header(self) -> str:
        """The CSV file's header line, in the original's column order."""
        return _core._monitor_csv_header(self.csv_names)

    def csv_row(self, iteration: int | None = None) -> str:
        """The CSV line of one recorded iteration (a row's ``step``; None: the latest)."""
        index = self._index(iteration, "csv_row")
        _modules, names, nbytes, grads = self._details[index]
        return _core._monitor_csv_row(_figures(self._records[index]), names, nbytes, grads)

    def printed_steps(self) -> list[int]:
        """The steps whose block was printed (and CSV row written): every
        ``print_period``-th iteration of each epoch."""
        return [r["step"] for r in self._records if r["iteration"] % self.print_period == 0]

    def to_csv(self, path: str | os.PathLike[str] | None = None) -> str:
        """The CSV the monitor writes with ``csv=True``: the header, then the printed
        iterations' rows (also written to ``path`` when given)."""
        text = self.csv_header() + "".join(self.csv_row(s) for s in self.printed_steps())
        return results.write_text(text, path)

    def plot_html(self) -> str:
        """Memory per iteration by category as one self-contained HTML fragment."""
        labels = [f"{r['epoch']}:{r['iteration']}" for r in self._records]
        values = [[r[c] for c in CATEGORIES] for r in self._records]
        title = f"memlab_rs monitor — {self._device}, peak allocated by category per iteration"
        return _core._monitor_html(title, list(CATEGORIES), labels, values)

    def _repr_html_(self) -> str:
        return self.plot_html()

    def __str__(self) -> str:
        return self.text() if self._records else "<MonitorResult: nothing recorded>"

    __repr__ = __str__

    def plot_png(self, path: str | os.PathLike[str]) -> None:
        """Save memory per iteration by category (stacked bars, MB) as a PNG (needs
        matplotlib)."""
        path = _args.path(path, "path")
        try:
            import matplotlib

            matplotlib.use("Agg", force=False)
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError("plot_png() needs matplotlib: pip install matplotlib") from None
        if not self._records:
            raise ValueError("plot_png(): nothing recorded yet; call record_stats() first")
        steps = [r["step"] for r in self._records]
        fig, ax = plt.subplots(figsize=(8, 4))
        bottom = [0.0] * len(steps)
        for name in CATEGORIES:
            heights = [r[name] / 1e6 for r in self._records]
            ax.bar(steps, heights, bottom=bottom, label=name)
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_xlabel("recorded iteration")
        ax.set_ylabel("MB at the iteration's peak")
        ax.set_title(f"memory per iteration by category ({self._device})")
        ax.legend(fontsize=8)
        fig.tight_layout()
        from ._trace_plots import save_figure

        try:
            save_figure(fig, path)
        finally:
            plt.close(fig)

    # ----- saved form -------------------------------------------------------------------

    def to_data(self) -> dict[str, Any]:
        """The result as JSON values (a saved file's ``data``). Parameter rows change
        rarely, so their names and bytes are saved once per layout (``layouts``) and each
        record's ``details`` name its layout by index."""
        layouts: list[dict[str, Any]] = []
        seen: dict[int, int] = {}
        details = []
        for modules, names, nbytes, grads in self._details:
            key = id(names)
            if key not in seen:
                seen[key] = len(layouts)
                layouts.append({"names": names.names, "bytes": list(nbytes)})
            details.append(
                {
                    "modules": [[m, b] for m, b in modules],
                    "layout": seen[key],
                    "grads": list(grads),
                }
            )
        return {
            "device": self._device,
            "verbose": self.verbose,
            "print_period": self.print_period,
            "csv_names": self.csv_names,
            "rows": self.rows(),
            "layouts": layouts,
            "details": details,
        }

    @classmethod
    def from_data(cls, data: dict[str, Any], meta: dict[str, Any]) -> MonitorResult:
        """The result from a saved file's ``data`` and ``meta`` (checked by ``load``
        against ``_result_schema.MONITOR``)."""
        layouts = [
            (_core.MonitorRowNames(layout["names"]), list(layout["bytes"]))
            for layout in data["layouts"]
        ]
        details: list[Details] = []
        for d in data["details"]:
            names, nbytes = layouts[d["layout"]]
            modules = [(name, nbytes_) for name, nbytes_ in d["modules"]]
            details.append((modules, names, nbytes, list(d["grads"])))
        return cls(
            device=data["device"],
            verbose=data["verbose"],
            print_period=data["print_period"],
            csv_names=list(data["csv_names"]),
            records=[dict(row) for row in data["rows"]],
            details=details,
            meta=meta,
        )


def _figures(
    r: dict[str, Any],
) -> tuple[int, int, int, int, int | None, int | None, int | None]:
    return (
        r["iteration"],
        r["epoch"],
        r["peak_cached"],
        r["current_cached"],
        r["feature_maps"],
        r["intermediate_gradients"],
        r["optimizer_state_usage"],
    )


results.register("monitor", MonitorResult.from_data)
