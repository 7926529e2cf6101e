"""`_core.monitor`: the training monitor's hooks (saved tensors, a backward's nodes, the reads
at each boundary), its record growing per iteration, and a monitor result checked and
rendered from its JSON text."""

from collections.abc import Callable, Sequence
from typing import Any, final

__all__ = [
    "GradientLog",
    "GradientNodeHook",
    "Recorder",
    "SavedHeld",
    "SavedTensorHooks",
    "Source",
    "Tensors",
    "data_ptrs",
    "render",
    "state_ids",
    "validate",
]

@final
class Source:
    """Allocated/reserved bytes of one device ("cpu" or "cuda:N"), peaks reset per read."""
    def __init__(self, device: str) -> None: ...
    def read(self) -> tuple[int, int, int, int, list[int]]:
        """(allocated, peak allocated, reserved, peak reserved, counts: allocations and frees
        since the last read, live blocks, requested bytes, those the source has); then
        resets the peaks."""
    def reader(self) -> str: ...
    def notice(self) -> str | None: ...

@final
class SavedHeld:
    """What autograd holds for one tensor saved under the monitor's hooks."""

@final
class SavedTensorHooks:
    """The monitor's saved-tensor pack/unpack pair and the weak log of what it saved."""
    def __init__(self, tensor_type: type, modules: list[str] | None = None) -> None: ...
    def chain(self, outer: tuple[Callable[..., Any], Callable[..., Any]] | None = None) -> None:
        """Chain ``outer`` under this pair from now on (called just before it is pushed)."""
    def pack(self, t: Any) -> SavedHeld: ...
    def unpack(self, held: SavedHeld) -> Any: ...
    def stop(self) -> None: ...
    def __len__(self) -> int: ...

@final
class Tensors:
    """The monitor's known tensors on one device (-1: CPU), read at each boundary."""
    def __init__(self, device: int) -> None: ...
    def set_model(
        self,
        params: Sequence[tuple[Any, int]],
        rows: int,
        param_ptrs: set[int],
        buffer_ptrs: set[int],
    ) -> None: ...
    def set_state(self, ptrs: set[int]) -> None: ...
    def gradients(self) -> tuple[int, list[int]]: ...
    def known_storages(self) -> set[int]: ...
    def activations(self, hooks: SavedTensorHooks) -> int: ...
    def activations_by_module(
        self, hooks: SavedTensorHooks, outside: str
    ) -> list[tuple[str, int]]: ...

@final
class GradientLog:
    """The intermediate gradients of a backward on one device (-1: CPU): hooks on the
    graph's nodes log what each receives and returns, weakly."""
    def __init__(self, device: int) -> None: ...
    def watch(self, roots: Sequence[Any]) -> list[Any]:
        """A post-hook on every node reachable from ``roots`` but AccumulateGrad; the
        handles, for the caller to remove."""
    def peak(self) -> int:
        """The most bytes of gradients that never became a leaf's, alive at once."""
    def close(self) -> None:
        """Stop logging; give torch's weak references to the storages back."""
    @property
    def incomplete(self) -> bool: ...
    @property
    def samples(self) -> int: ...

@final
class GradientNodeHook:
    """One node's post-hook (torch calls it with what the node returned and received)."""
    def __call__(self, grad_inputs: Any, grad_outputs: Any) -> None: ...

def state_ids(state: Any) -> list[int]:
    """The identities of an optimizer's state values (a dict of dicts), in order."""
def data_ptrs(tensors: Sequence[Any]) -> list[int]: ...

@final
class Recorder:
    """A live monitor's record: its settings first (JSON: device, verbose, print_period,
    csv_names), then one iteration at a time."""
    def __init__(self, head: str) -> None: ...
    def set_layout(self, layout: str) -> None:
        """The parameter rows from now on (``{"names": [...], "bytes": [...]}``)."""
    def push(self, iteration: str) -> int:
        """Add one iteration (its JSON); its step."""
    def data(self) -> str:
        """The record so far as a ``monitor`` result's data (JSON text)."""
    def render(self, format: str, view: str) -> str:
        """The record so far rendered, as ``render`` does."""
    def __len__(self) -> int: ...

def validate(data: str) -> str:
    """The data as its derive reads it, with the rules between its fields (a ValueError
    naming the field that does not fit)."""

def render(data: str, format: str, view: str) -> str:
    """The record as ``text`` (one iteration's block), ``csv`` (the file, one row, or the
    header) or ``html`` (the plot); view: ``{"iteration": step, "header": bool}``."""
