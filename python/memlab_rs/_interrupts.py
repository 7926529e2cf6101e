"""Glue that takes a failed read for "unknown" (``except Exception``) must still let an
interrupt through: a Python signal handler runs between any two bytecodes, and what it
raises (the usual SIGALRM timeout is an ``Exception``) comes out of whatever the glue was
doing. ``reraise_interrupt(error)`` re-raises such an error; the sorting is the Rust
core's (``_core._interrupts``), the same as for its own per-tensor loops."""

from __future__ import annotations

from . import _core


def reraise_interrupt(error: BaseException) -> None:
    """Raise ``error`` again when it is not the read's own failure: a signal handler's
    exception, a MemoryError (KeyboardInterrupt never reaches an ``except Exception``)."""
    if _core._interrupts(error):
        raise error
