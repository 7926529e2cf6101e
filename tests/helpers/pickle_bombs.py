"""Pickle bombs shared by the load-safety tests of snapshot pickles: the in-process ones
(tests/unit/results/test_load_safety.py) and those in a process with a limited address
space (tests/integration/test_load_safety_processes.py)."""

from __future__ import annotations

import struct


def laughs(levels: int) -> bytes:
    """l0 = [None]; l(i+1) = [l(i), l(i)]: 2**levels values from a few hundred bytes."""
    out = b"\x80\x04]\x94N\x61"
    for i in range(levels):
        out += b"]\x94(" + b"j" + struct.pack("<I", i) + b"j" + struct.pack("<I", i) + b"e"
    return out + b"."
