"""The tensor diff tracker (kind ``tracker``): which tensors appeared and vanished between two
calls (``MemTracker``, the drop-in for Pytorch-Memory-Utils'), and what one call found, as
data (``TrackResult``, ``TrackRow``). The Rust side is ``_core.tracker``."""

from memlab_rs.tracker.result import TrackResult, TrackRow
from memlab_rs.tracker.track import MemTracker

__all__ = ["MemTracker", "TrackResult", "TrackRow"]
