"""`_core.tracker`: the tensor diff tracker (MemTracker): its collector, and a track()'s
result checked and rendered from its JSON text."""

from collections.abc import Sequence
from typing import Any, final

__all__ = ["TrackerCore", "validate", "render"]

@final
class TrackerCore:
    """The tensor diff tracker's state: the groups of the last call, no tensor."""

    def __new__(cls, device: str) -> TrackerCore: ...
    def track(
        self,
        named: Sequence[tuple[Any, str]],
        place: str,
        detail: bool,
        stamp: str | None = None,
        allocated: int | None = None,
    ) -> str:
        """Walk, group, diff against the last call: the `tracker` result's JSON."""
    def reset(self) -> None: ...

def validate(data: str) -> str:
    """The data as its derive reads it (a ValueError naming the field that does not fit)."""

def render(data: str, format: str, view: str) -> str:
    """The result as text (the log's block) or html (it takes no view options)."""
