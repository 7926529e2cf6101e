"""`_core.doctor`: the doctor's results (post-mortem, fragmentation, leaks) checked and
rendered from their JSON text."""

__all__ = ["postmortem_complete", "postmortem_validate", "postmortem_render"]

def postmortem_complete(facts: str) -> str:
    """The post-mortem from the facts gathered (JSON): its pools and advice computed."""

def postmortem_validate(data: str) -> str:
    """A post-mortem's data as its derive reads it (a ValueError naming the field)."""

def postmortem_render(data: str, format: str, view: str) -> str:
    """The post-mortem as `text`, `summary`, `html` or `json`."""
