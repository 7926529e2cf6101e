"""`_core.doctor`: the doctor's results (post-mortem, fragmentation, leaks) checked and
rendered from their JSON text."""

__all__ = [
    "fragmentation_analyse",
    "fragmentation_validate",
    "fragmentation_render",
    "postmortem_complete",
    "postmortem_validate",
    "postmortem_render",
    "leaks_analyse",
    "leaks_validate",
    "leaks_render",
    "leaks_limit_text",
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

# -- leaks (src/doctor/leaks) --

def leaks_analyse(recording: str) -> str:
    """The growing sites of a leak check's recording (JSON), as a ``leaks`` result's JSON."""

def leaks_validate(data: str) -> str:
    """A ``leaks`` result's data as its derive reads it (a ValueError naming the field)."""

def leaks_render(data: str, format: str, view: str) -> str:
    """A ``leaks`` result as text (``format="text"``; it takes no view options)."""

def leaks_limit_text(data: str, marker: str, limit: int) -> str:
    """The failure message of a test whose sites grew by more than ``limit`` bytes a call."""
