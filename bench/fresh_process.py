"""A bench function run in a Python process of its own, as a user's training starts: what a
step reserves on CUDA depends on the addresses the driver gives its segments, and a process
that has given segments back gets their ranges again (``bench/plan_check.py``'s
``real_reserved`` says how much that moved)."""

from __future__ import annotations

import os
import subprocess
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def last_line(module: str, function: str, *args: object) -> str:
    """The last line ``module.function(*args)`` (a module of bench/) printed in a new
    process; a RuntimeError with the end of its stderr when it failed or printed nothing."""
    call = f"{module}.{function}({', '.join(repr(a) for a in args)})"
    code = f"import sys; sys.path.insert(0, {_HERE!r}); import {module}; {call}"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{call} failed in its process: {done.stderr.strip()[-2000:]}")
    return lines[-1]
