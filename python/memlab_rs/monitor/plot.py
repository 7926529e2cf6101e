"""The monitor's rows as pictures and tables that need an optional package: the PNG of
memory per iteration by category (matplotlib) and the data frame (pandas). The HTML plot
needs nothing: ``_core.monitor.render(data, "html", ...)``."""

from __future__ import annotations

import os
from typing import Any

from .. import _args
from .._categories import CATEGORIES
from ..results.atomic import save_figure


def dataframe(rows: list[dict[str, Any]]) -> Any:
    """The rows as a pandas DataFrame (needs pandas)."""
    try:
        import pandas
    except ImportError:
        raise ImportError("to_dataframe() needs pandas: pip install pandas") from None
    return pandas.DataFrame(rows)


def plot_png(rows: list[dict[str, Any]], device: str, path: str | os.PathLike[str]) -> None:
    """Save the rows' memory by category (stacked bars, MB) as a PNG (needs matplotlib)."""
    path = _args.path(path, "path")
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plot_png() needs matplotlib: pip install matplotlib") from None
    if not rows:
        raise ValueError("plot_png(): nothing recorded yet; call record_stats() first")
    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4))
    bottom = [0.0] * len(steps)
    for name in CATEGORIES:
        heights = [r[name] / 1e6 for r in rows]
        ax.bar(steps, heights, bottom=bottom, label=name)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xlabel("recorded iteration")
    ax.set_ylabel("MB at the iteration's peak")
    ax.set_title(f"memory per iteration by category ({device})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        save_figure(fig, path)  # whole or not at all
    finally:
        plt.close(fig)
