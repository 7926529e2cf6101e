"""`_core.test_memory`: a test's memory (the pytest plugin's result) checked and rendered from
its JSON text."""

__all__ = ["validate", "render", "limit_text", "top_table"]

def validate(data: str) -> str:
    """The data as its derive reads it (a ValueError naming the field that does not fit)."""

def render(data: str, format: str, view: str) -> str:
    """The result as text (`format="text"`; it takes no view options)."""

def limit_text(measurement: str, marker: str, top: int) -> str:
    """The failure message of one measurement over its limit."""

def top_table(device: str, peaks: str, measured: int) -> str:
    """The session's table of one device's highest peaks."""
