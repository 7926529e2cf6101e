"""`_core.doctor`: the doctor's results (post-mortem, fragmentation, leaks) checked and
rendered from their JSON text."""

__all__ = [
    "fragmentation_analyse",
    "fragmentation_validate",
    "fragmentation_render",
]

# -- fragmentation (src/allocator/fragmentation; bound in src/doctor/py.rs) --

def fragmentation_analyse(input: str) -> str:
    """The fragmentation result's JSON from one device's snapshot JSON (a ValueError naming
    the field a damaged snapshot breaks)."""

def fragmentation_validate(data: str) -> str:
    """A fragmentation result's data as its derive reads it."""

def fragmentation_render(data: str, format: str, view: str) -> str:
    """The result as text, html, json or csv (it takes no view options)."""
