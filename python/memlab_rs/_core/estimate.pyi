"""`_core.estimate`: a fake training step's recording replayed through an allocator model,
and an estimate checked and rendered from its JSON text."""

__all__ = ["plan_complete", "plan_render", "plan_validate", "render", "replay", "validate"]

def replay(recording: str) -> str:
    """Replay a recording (JSON: ``device_type``, ``events`` as ``[op, id, bytes]``,
    ``categories``, ``n_categories``, ``n_phases``); the replay's figures as JSON."""

def validate(data: str) -> str:
    """The data as its derive reads it, with the rules between its fields (a ValueError
    naming the field that does not fit)."""

def render(data: str, format: str, view: str) -> str:
    """The estimate as ``text`` (the modelsize style) or ``html``; it takes no view."""

def plan_complete(rows: str) -> str:
    """A what-if plan from its rows (JSON), with the choice that saves the most found."""

def plan_validate(data: str) -> str:
    """A ``plan`` result's data checked and in canonical form; a ValueError names the field."""

def plan_render(data: str, format: str, view: str) -> str:
    """The plan as ``text`` (its table) or ``json``; it takes no view."""
