"""`_core.doctor`: the doctor's results (post-mortem, fragmentation, leaks) checked and
rendered from their JSON text."""

__all__ = [
    "fragmentation_analyse",
    "fragmentation_validate",
    "fragmentation_render",
    "postmortem_complete",
    "postmortem_validate",
    "postmortem_render",
]

# -- fragmentation (src/allocator/fragmentation; bound in src/doctor/py.rs) --

def fragmentation_analyse(input: str) -> str:
    """The fragmentation result's JSON from one device's snapshot JSON (a ValueError naming
    the field a damaged snapshot breaks)."""

def fragmentation_validate(data: str) -> str:
    """A fragmentation result's data as its derive reads it."""

def fragmentation_render(data: str, format: str, view: str) -> str:
    """The result as text, html, json or csv (it takes no view options)."""

# -- the post-mortem (src/doctor/postmortem) --

def postmortem_complete(facts: str) -> str:
    """The post-mortem from the facts gathered (JSON): its pools and advice computed."""

def postmortem_validate(data: str) -> str:
    """A post-mortem's data as its derive reads it (a ValueError naming the field)."""

def postmortem_render(data: str, format: str, view: str) -> str:
    """The post-mortem as `text`, `summary`, `html` or `json`."""
