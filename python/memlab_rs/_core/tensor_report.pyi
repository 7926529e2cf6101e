"""`_core.tensor_report`: the tensor report (MemReporter): the gc walk, and the report
checked, viewed, compared and rendered from its JSON text."""

from collections.abc import Sequence
from typing import Any

__all__ = ["collect", "with_cuda", "view", "validate", "render", "sections", "diff", "diff_text"]

def collect(named: Sequence[tuple[Any, str]], pre_collect: bool = False) -> tuple[str, list[str]]:
    """Walk gc: the report's JSON (every device, no view) and the CUDA devices it found."""

def with_cuda(
    data: str, figures: Sequence[tuple[str, int, int | None, int | None, str | None]]
) -> str:
    """The report with each device's (device, allocated, requested, reserved, allocator
    state JSON or None) attached."""

def view(
    data: str,
    devices: Sequence[str] | None = None,
    sort_by: str | None = None,
    top: int | None = None,
    verbose: bool = False,
) -> str:
    """The report keeping some devices, rows sorted and cut, its text verbose or not."""

def validate(data: str) -> str:
    """The data as its derive reads it (a ValueError naming the field that does not fit)."""

def render(data: str, format: str, view: str) -> str:
    """The report as text (the view may say `verbose`), html or json."""

def sections(data: str) -> str:
    """Per-device totals as a JSON list, the CUDA remainder explained."""

def diff(a: str, b: str) -> str:
    """What changed from report a to report b: `{"rows": [...], "totals": [...]}`."""

def diff_text(diff: str) -> str:
    """A tensor diff's text, from `{"names": [A, B], "rows": [...], "totals": [...]}`."""
