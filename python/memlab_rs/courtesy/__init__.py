"""Courtesy: give the GPU back for a while (preemption on a shared cluster), take it again:
``Courtesy`` (``moves``: the storages moved to pinned host buffers and back), its reports
(``reports``), and ``on_signal``/``Preemption`` (``preemption``: yield and restore when a
signal asks); regions (``regions``: memory a pause gives back while every address
stays). The Rust side is ``_core.courtesy``. pytorch_memlab's path holds:
``pytorch_memlab.courtesy.Courtesy`` under ``import memlab_rs as pytorch_memlab``."""

from memlab_rs.courtesy.moves import Courtesy
from memlab_rs.courtesy.preemption import Preemption, on_signal
from memlab_rs.courtesy.regions import CourtesyRegionUnavailable, Region
from memlab_rs.courtesy.reports import (
    CourtesyRegionError,
    CourtesyRestoreError,
    RegionReport,
    RestoreReport,
    YieldReport,
)

__all__ = [
    "Courtesy",
    "CourtesyRegionError",
    "CourtesyRegionUnavailable",
    "CourtesyRestoreError",
    "Preemption",
    "Region",
    "RegionReport",
    "RestoreReport",
    "YieldReport",
    "on_signal",
]
