"""`_core.doctor`: the doctor's results (post-mortem, fragmentation, leaks) checked and
rendered from their JSON text."""

__all__: list[str] = []
