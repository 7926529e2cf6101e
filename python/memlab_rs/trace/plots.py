"""Pictures of a trace as PNG files through matplotlib, and the top-entries table.

matplotlib is optional (``pip install "memlab_rs[plot]"``): it is imported only when a PNG
is drawn, and its absence gives an ImportError that says what to install. The figures are
drawn on a bare ``Figure`` (never pyplot), so no GUI backend is touched and no global figure
state changes.

- ``timeline_png(view, path)``: the same picture as the HTML timeline
  (``timeline.timeline_html``), from the view checked by the same rules
  (``timeline.checked``): the top locations stacked over time, the total as a line, the
  peak marked with its exact bytes.
- ``keyword_plot_png(groups, expected_mib, path)``: the tagging profiler's two bars: the
  keyword groups stacked (with ``Others`` and ``Untrackable``) beside the expected total.
- ``top_entries_table(rows, n)``: the largest entries by MiB as plain text.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from typing import Any, Union

from .. import _args
from ..results.atomic import save_figure
from .timeline import checked

PathLike = Union[str, "os.PathLike[str]"]

INSTALL_HINT = (
    'drawing PNG files needs matplotlib: pip install "memlab_rs[plot]" (or pip install '
    "matplotlib); the HTML timeline needs nothing"
)

# The HTML timeline's palette and sizes (src/trace/render/timeline.rs), so both pictures agree.
COLORS = [
    "#4e79a7",
    "#f28e2c",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc949",
    "#af7aa1",
    "#ff9da7",
    "#9c755f",
]
OTHER_COLOR = "#bab0ab"
PEAK_COLOR = "#b00020"
MAX_POINTS = 4000
TARGET_POINTS = 2000
LABEL_CHARS = 44
MiB = 1 << 20
_UNITS = [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")]


def _figure(width: float, height: float) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(INSTALL_HINT) from error
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def human_bytes(n: int) -> str:
    """Bytes in IEC units with one decimal, as the HTML timeline prints them.

    >>> human_bytes(5 * 1024 * 1024 + 123)
    '5.0 MiB'
    >>> human_bytes(10)
    '10 B'
    """
    value, unit = float(abs(n)), "B"
    for factor, name in _UNITS:
        if abs(n) >= factor:
            value, unit = abs(n) / factor, name
            break
    text = f"{abs(n)} B" if unit == "B" else f"{value:.1f} {unit}"
    return f"-{text}" if n < 0 else text


def short_label(full: str) -> str:
    """A location as the legend shows it: the file name without its folders, shortened in
    the middle when still long (the HTML timeline's rule).

    >>> short_label("/home/u/model.py:42 (forward)")
    'model.py:42 (forward)'
    """
    head_end = full.find(" (")
    head = full if head_end < 0 else full[:head_end]
    start = max(head.rfind("/"), head.rfind("\\")) + 1
    short = full[start:].strip() or full
    if len(short) <= LABEL_CHARS:
        return short
    first = (LABEL_CHARS - 1) // 2
    last = LABEL_CHARS - 1 - first
    return short[:first] + "…" + short[-last:]


def _downsample(v: dict[str, Any]) -> None:
    """Keep the largest total of each bucket (the peak in its own), as the HTML does."""
    n = len(v["total"])
    total, peak = v["total"], v["peak_index"]
    keep = []
    for k in range(TARGET_POINTS):
        start, end = k * n // TARGET_POINTS, (k + 1) * n // TARGET_POINTS
        if start <= peak < end:
            keep.append(peak)
        else:
            keep.append(max(range(start, end), key=lambda i: (total[i], -i)))
    v["peak_index"] = keep.index(peak)
    v["time_us"] = [v["time_us"][i] for i in keep]
    v["total"] = [total[i] for i in keep]
    v["layers"] = [(name, [values[i] for i in keep]) for name, values in v["layers"]]
    v["notices"].append(
        f"Downsampled from {n} to {len(keep)} samples for drawing (each is the sample with "
        f"the largest total among about {n / TARGET_POINTS:.1f} consecutive ones)."
    )


def _is_other(index: int, count: int, name: str) -> bool:
    return index + 1 == count and name.strip("<>()[] ").lower() == "other"


def _unit(max_bytes: int) -> tuple[int, str]:
    for factor, name in _UNITS:
        if max_bytes >= factor:
            return factor, name
    return 1, "B"


def timeline_png(view: dict[str, Any], path: PathLike, *, dpi: int = 100) -> None:
    """Draw the timeline of a trace to a PNG file: the top locations stacked over time,
    the total as a line, the peak marked with its exact bytes (the HTML timeline's picture).

    ``view`` is the dict ``report.timeline(device)`` returns (keys ``title``, ``time_us``,
    ``total``, ``layers``, ``peak_index``, ``peak_bytes``, ``notices``). Needs matplotlib
    (``pip install "memlab_rs[plot]"``).

    >>> view = {"title": "cpu", "time_us": [0, 1000, 2000], "total": [0, 1 << 20, 0],
    ...         "layers": [("model.py:3 (f)", [0, 1 << 20, 0])], "peak_index": 1,
    ...         "peak_bytes": 1 << 20, "notices": []}
    >>> timeline_png(view, "timeline.png")  # doctest: +SKIP
    """
    v = checked(view)
    path = _args.path(path, "path")
    fig = _figure(12, 6.2)
    if len(v["total"]) > MAX_POINTS:
        _downsample(v)
    n = len(v["total"])
    title = f"Allocated memory over time: {v['title'] or 'memory timeline'}"
    if v["notices"]:
        title += "\n" + "\n".join(f"Note: {x}" for x in v["notices"])
    fig.suptitle(title, x=0.01, ha="left", fontsize=12)
    ax = fig.add_subplot()
    if n == 0:
        ax.text(0.5, 0.5, "No samples: nothing was allocated while tracing.", ha="center")
        ax.set_axis_off()
        save_figure(fig, path, dpi)
        return
    t0 = v["time_us"][0]
    t_ms = [(t - t0) / 1000.0 for t in v["time_us"]]
    peak, peak_bytes = v["peak_index"], v["peak_bytes"]
    stacked_max = max(sum(values[i] for _, values in v["layers"]) for i in range(n))
    factor, unit = _unit(int(max(max(v["total"]), peak_bytes, stacked_max) * 1.12))
    count = len(v["layers"])
    if count:
        ax.stackplot(
            t_ms,
            *[[x / factor for x in values] for _, values in v["layers"]],
            labels=[
                f"{short_label(name)}  {human_bytes(values[peak])}" for name, values in v["layers"]
            ],
            colors=[
                OTHER_COLOR if _is_other(k, count, name) else COLORS[k % len(COLORS)]
                for k, (name, _) in enumerate(v["layers"])
            ],
            alpha=0.85,
            linewidth=0,
        )
    ax.plot(t_ms, [x / factor for x in v["total"]], color="#222222", lw=1.5, label="total")
    ax.axvline(t_ms[peak], color=PEAK_COLOR, ls="--", lw=1.2)
    ax.plot([t_ms[peak]], [peak_bytes / factor], "o", color=PEAK_COLOR, ms=5)
    top = max(max(v["total"]), peak_bytes, stacked_max, 1) * 1.12 / factor
    ax.set_ylim(0, top)
    ax.set_xlim(0, t_ms[-1] if t_ms[-1] > 0 else 1.0)
    right_half = t_ms[peak] > 0.6 * (t_ms[-1] or 1.0)
    ax.annotate(
        f"peak {human_bytes(peak_bytes)} ({peak_bytes} bytes)",
        xy=(t_ms[peak], top),
        xytext=(-6 if right_half else 6, -14),
        textcoords="offset points",
        ha="right" if right_half else "left",
        color=PEAK_COLOR,
        fontweight="bold",
        fontsize=11,
    )
    ax.set_xlabel("time since the first sample (ms)")
    ax.set_ylabel(f"allocated memory ({unit})")
    ax.grid(color="#e4e4e4", lw=0.8)
    ax.set_axisbelow(True)
    handles, labels = ax.get_legend_handles_labels()
    # total first, then the layers biggest first (stackplot lists them bottom up)
    order = [len(handles) - 1, *range(len(handles) - 1)]
    ax.legend(
        [handles[i] for i in order],
        [labels[i] for i in order],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=9,
        frameon=False,
        title="top locations, at the peak",
        title_fontsize=9,
        alignment="left",
    )
    save_figure(fig, path, dpi)


def _mib_pairs(items: Any, parameter: str, noun: str) -> list[tuple[str, float]]:
    """``items`` as (name, MiB) pairs with finite sizes; a TypeError or ValueError naming
    ``parameter`` (or the ``noun`` of the bad item) otherwise."""
    pairs = []
    for item in items:
        try:
            name, mib = item
            mib = float(mib)
        except (TypeError, ValueError) as error:
            raise TypeError(f"{parameter} must hold (name, MiB) pairs, got {item!r:.60}") from error
        if not math.isfinite(mib):
            raise ValueError(f"{noun} {name!r} has {mib} MiB; sizes must be finite numbers")
        pairs.append((str(name), mib))
    return pairs


def keyword_plot_png(
    groups: Sequence[tuple[str, float]], expected_mib: float, path: PathLike, *, dpi: int = 100
) -> None:
    """Draw the tagging profiler's two-bar plot to a PNG file: the keyword groups stacked
    in one bar (``Others`` and ``Untrackable`` among them), the expected total in the other.

    ``groups`` is a list of ``(name, MiB)`` pairs, in the order to stack them from the
    bottom. A negative group (``Untrackable`` when more was tracked than expected) cannot be
    stacked: it is named in the legend and in a note. Needs matplotlib.

    >>> keyword_plot_png([("attn", 300.0), ("mlp", 500.0), ("Others", 40.0),
    ...                   ("Untrackable", 160.0)], 1000.0, "groups.png")  # doctest: +SKIP
    """
    checked = _mib_pairs(groups, "groups", "group")
    path = _args.path(path, "path")
    expected = float(expected_mib)
    if not math.isfinite(expected) or expected < 0:
        raise ValueError(f"expected_mib must be a finite number >= 0, got {expected_mib!r}")
    fig = _figure(9, 6)
    ax = fig.add_subplot()
    bottom = 0.0
    notes = []
    color_index = 0
    tracked = sum(m for _, m in checked if m > 0)
    for name, mib in checked:
        edge = "white"
        if name == "Untrackable":
            color, hatch, edge = "#eeeeee", "//", "#999999"
        elif name == "Others":
            color, hatch = OTHER_COLOR, None
        else:
            color, hatch = COLORS[color_index % len(COLORS)], None
            color_index += 1
        label = f"{name}  {mib:.2f} MiB"
        if mib < 0:
            notes.append(f"{name} is {mib:.2f} MiB: more was tracked than expected")
            ax.bar([0], [0], color=color, hatch=hatch, label=label)
            continue
        ax.bar(
            [0],
            [mib],
            bottom=[bottom],
            width=0.6,
            color=color,
            hatch=hatch,
            edgecolor=edge,
            linewidth=0.8,
            label=label,
        )
        if mib >= 0.04 * max(tracked, expected, 1e-9):
            ax.text(
                0,
                bottom + mib / 2,
                f"{short_label(name)}\n{mib:.1f} MiB",
                ha="center",
                va="center",
                fontsize=9,
            )
        bottom += mib
    ax.bar([1], [expected], width=0.6, color="#4d4d4d", label=f"expected  {expected:.2f} MiB")
    ax.text(1, expected, f"{expected:.1f} MiB", ha="center", va="bottom", fontsize=10)
    ax.text(0, bottom, f"{bottom:.1f} MiB", ha="center", va="bottom", fontsize=10)
    ax.set_xticks([0, 1], ["by keyword group", "expected total"])
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylim(0, max(bottom, expected, 1e-9) * 1.1)
    ax.set_ylabel("MiB")
    ax.grid(axis="y", color="#e4e4e4", lw=0.8)
    ax.set_axisbelow(True)
    title = "Memory by keyword group against the expected total"
    if notes:
        title += "\n" + "\n".join(f"Note: {x}" for x in notes)
    ax.set_title(title, fontsize=12, loc="left")
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(
        handles[::-1],
        labels[::-1],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=9,
        frameon=False,
    )
    save_figure(fig, path, dpi)


def top_entries_table(rows: Iterable[tuple[str, float]], n: int = 10) -> str:
    """The ``n`` largest entries by MiB as a plain-text table, with each one's share of
    the sum of all (positive) entries.

    >>> print(top_entries_table([("embed", 12.5), ("attn", 100.0), ("mlp", 137.5)], n=2))
    Top 2 of 3 entries by MiB
    Rank         MiB   Share  Entry
       1      137.50   55.0%  mlp
       2      100.00   40.0%  attn
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    entries = _mib_pairs(rows, "rows", "entry")
    total = sum(m for _, m in entries if m > 0)
    top = sorted(entries, key=lambda e: -e[1])[:n]
    lines = [
        f"Top {len(top)} of {len(entries)} entries by MiB",
        f"{'Rank':<4} {'MiB':>11} {'Share':>7}  Entry",
    ]
    for rank, (name, mib) in enumerate(top, 1):
        share = f"{100.0 * mib / total:.1f}%" if total > 0 else "-"
        lines.append(f"{rank:>4} {mib:>11.2f} {share:>7}  {name}")
    return "\n".join(lines)

