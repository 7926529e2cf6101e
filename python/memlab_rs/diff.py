"""The diff of tensor reports: two reports tensor by tensor (per name and device: the change
in bytes). ``memlab_rs.diff_results`` (in ``results.diff``) reaches it through the diff
registered below. (Line profiles compare in their room: ``memlab_rs.line_profiler.diff``.)"""

from __future__ import annotations

from typing import Any

from .results.diff import ResultDiff, register_diff


def _tensor_diff(a: Any, b: Any, names: list[str]) -> ResultDiff:
    rows_a, rows_b = _tensors(a), _tensors(b)
    keys = list(rows_a) + [k for k in rows_b if k not in rows_a]
    changed = []
    for key in keys:
        ra, rb = rows_a.get(key), rows_b.get(key)
        va = ra["bytes"] if ra else 0
        vb = rb["bytes"] if rb else 0
        if va != vb:
            shown = rb or ra
            assert shown is not None
            changed.append(
                {
                    "name": shown["name"],
                    "device": key[1],
                    "shape": shown["shape"],
                    "dtype": shown["dtype"],
                    "a": va,
                    "b": vb,
                    "change": vb - va,
                }
            )
    totals_a, totals_b = _device_totals(a), _device_totals(b)
    devices = list(totals_a) + [d for d in totals_b if d not in totals_a]
    totals = [
        {
            "device": d,
            "a": totals_a.get(d, 0),
            "b": totals_b.get(d, 0),
            "change": totals_b.get(d, 0) - totals_a.get(d, 0),
        }
        for d in devices
    ]
    return ResultDiff("tensor_report", names, _ordered(changed), totals)


def _tensors(report: Any) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Rows by name and device; tensors nothing names by device, shape and dtype (their
    numbered names depend on the order they were found in). Rows of one key add up."""
    from .merge import tensor_key

    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in report.rows:
        name, key = tensor_key(row.name, row.device, row.shape, row.dtype)
        if key in found:
            found[key]["bytes"] += int(row.bytes)
        else:
            found[key] = {
                "name": name,
                "bytes": int(row.bytes),
                "shape": str(row.shape),
                "dtype": row.dtype,
            }
    return found


def _device_totals(report: Any) -> dict[str, int]:
    return {s["device"]: int(s["total_bytes"]) for s in report.sections()}


def _ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Growth first, largest first; then shrinking, largest first."""
    return sorted(rows, key=lambda r: (r["change"] < 0, -abs(r["change"])))


register_diff(
    "tensor_report", lambda a, b, names, columns: _tensor_diff(a, b, names)
)
