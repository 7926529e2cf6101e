"""pytorch_memlab's module path of ``readable_size``: ``from pytorch_memlab.utils import
readable_size`` keeps working with ``import memlab_rs as pytorch_memlab``."""

from memlab_rs._core import readable_size

__all__ = ["readable_size"]
