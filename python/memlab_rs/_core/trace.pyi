"""`_core.trace`: allocation histories analysed (what was alive at the peak, by line and by
module), snapshot pickles checked before anything reads them, the timeline drawn. Every
structured value crosses as JSON text its serde derive (src/trace/result.rs) reads or writes."""

from typing import Any, final

__all__ = ["TraceAnalysis", "validate", "check_snapshot_pickle", "timeline_view", "timeline_html"]

@final
class TraceAnalysis:
    """A snapshot read and analysed once; the analysed report stays in Rust."""

    def __new__(cls, snapshot: dict[str, Any], options: str) -> TraceAnalysis: ...
    @staticmethod
    def from_pickle(path: str, options: str) -> TraceAnalysis:
        """Analyse the snapshot pickle at ``path`` without building its Python objects."""
    def about(self) -> str:
        """``{"source", "devices": [{"index", "name"}]}``."""
    def summary(self, device: int) -> str:
        """The peak figures of one device."""
    def rows(self, device: int, by: str) -> str:
        """``[{"key", "bytes", "cumulative", "median", "count"}]`` by location or module."""
    def notices(self, device: int) -> str:
        """Why the result may be incomplete, as a JSON list of str."""
    def keywords(self, device: int, query: str) -> str:
        """``[[group, bytes]]`` for ``{"groups": [[name, [keyword]]], "by"}``."""
    def line_peak_live(self, device: int) -> str:
        """``[{"filename", "line", "bytes"}]``."""
    def timeline(self, device: int, top: int = 8, max_points: int = 2000) -> str:
        """The timeline view of one device."""
    def render(self, format: str, view: str) -> str:
        """``text``, ``html``, ``json``, ``csv`` or ``untagged_log`` with the view's options."""

def validate(data: str) -> None:
    """Check a saved trace's fields but its snapshot (a ValueError naming the field)."""

def check_snapshot_pickle(path: str) -> str:
    """Check a pickle before anything reads it: ``{"protocol", "values"}``; ValueError says
    why not."""

def timeline_view(view: str) -> str:
    """A timeline view checked as the renderers draw it, in canonical form."""

def timeline_html(view: str) -> str:
    """The timeline as one self-contained HTML page."""
