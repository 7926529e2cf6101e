"""pytorch_memlab's module path of ``MemReporter``: ``from pytorch_memlab.mem_reporter import
MemReporter`` keeps working with ``import memlab_rs as pytorch_memlab``. The reporter itself
lives in ``memlab_rs.tensor_report``."""

from memlab_rs.tensor_report import MemReporter

__all__ = ["MemReporter"]
