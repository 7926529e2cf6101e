"""Where the installed ``memlab-rs`` console script is, for the tests that run it as users
do: beside this interpreter (a venv), else on PATH, else in the ``bin`` folder that
``pip install --target DIR`` writes beside the package (the GPU machine's install, where
DIR/bin is not on PATH)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import memlab_rs


def find_memlab_rs() -> Path:
    beside = Path(sys.executable).parent / "memlab-rs"
    on_path = shutil.which("memlab-rs")
    target_bin = Path(memlab_rs.__file__).parents[1] / "bin" / "memlab-rs"
    for candidate in (beside, Path(on_path) if on_path else None, target_bin):
        if candidate is not None and candidate.exists():
            return candidate
    return beside  # running it fails naming the path a venv install would have made


MEMLAB_RS = find_memlab_rs()
