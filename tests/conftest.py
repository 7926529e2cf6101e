"""Shared test set-up: the `cuda` marker, and running a script in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    # CUDA tests run on the GPU machine (shared/GPU.md); without a GPU they cannot run.
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: run `pytest -m cuda` on the GPU machine")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def run_script(source: str, timeout: float = 120) -> str:
    """Run ``source`` in a fresh interpreter and return its stdout; fail on a non-zero exit."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture
def script():
    return run_script
