"""memlab_rs: where your PyTorch memory goes. A fast, exact successor of pytorch_memlab.

``import memlab_rs as pytorch_memlab`` works in existing code.
"""

from ._core import readable_size
from .reporter import MemoryReport, MemReporter, TensorRow

__all__ = ["MemReporter", "MemoryReport", "TensorRow", "readable_size"]
__version__ = "0.1.0"
