"""`_core.merged_tensor_report`: tensor reports of several ranks merged tensor by tensor,
checked and rendered from the merged report's JSON text."""

__all__ = ["merge", "validate", "render", "records"]

def merge(inputs: str) -> str:
    """`{"ranks": [...], "world_size": N, "reports": [data, ...]}` merged: its JSON."""

def validate(data: str) -> str:
    """The data as its derive reads it, and its rules between fields (a ValueError naming
    the field that does not fit)."""

def render(data: str, format: str, view: str) -> str:
    """The merged report as text, html or csv (its records); it takes no view options."""

def records(data: str) -> str:
    """One record per tensor as a JSON list (the spread across ranks, bytes per rank)."""
