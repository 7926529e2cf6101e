"""`_core.doctor`: the doctor's results (post-mortem, fragmentation, leaks) checked and
rendered from their JSON text."""

__all__ = ["leaks_analyse", "leaks_validate", "leaks_render", "leaks_limit_text"]

def leaks_analyse(recording: str) -> str:
    """The growing sites of a leak check's recording (JSON), as a ``leaks`` result's JSON."""

def leaks_validate(data: str) -> str:
    """A ``leaks`` result's data as its derive reads it (a ValueError naming the field)."""

def leaks_render(data: str, format: str, view: str) -> str:
    """A ``leaks`` result as text (``format="text"``; it takes no view options)."""

def leaks_limit_text(data: str, marker: str, limit: int) -> str:
    """The failure message of a test whose sites grew by more than ``limit`` bytes a call."""
