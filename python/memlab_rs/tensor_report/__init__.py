"""The tensor report (kind ``tensor_report``): every tensor Python can reach, by device, each
storage counted once (``MemReporter``, the drop-in for pytorch_memlab's), its result as data
(``MemoryReport``, ``TensorRow``), several ranks' reports merged (``MergedTensorReport``) and
two reports compared (``TensorReportDiff``). The Rust side is ``_core.tensor_report`` and
``_core.merged_tensor_report``."""

from memlab_rs.tensor_report.diff import TensorReportDiff
from memlab_rs.tensor_report.merged import MergedTensorReport
from memlab_rs.tensor_report.reporter import MemReporter
from memlab_rs.tensor_report.result import MemoryReport, TensorRow

__all__ = ["MemReporter", "MemoryReport", "MergedTensorReport", "TensorReportDiff", "TensorRow"]
