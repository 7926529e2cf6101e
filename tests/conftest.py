"""Shared test set-up: the `cuda` marker, and running a script in a fresh interpreter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    # CUDA tests run on a GPU machine (CONTRIBUTING.md); without a GPU they cannot run.
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: run `pytest -m cuda` on the GPU machine")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def run_script(
    source: str, timeout: float = 120, check: bool = True, env: dict[str, str] | None = None
) -> str:
    """Run ``source`` as a script file in a fresh interpreter and return its stdout.

    A file rather than ``-c``, so that profiled functions have source lines to show.
    Fails on a non-zero exit unless ``check`` is False. ``env`` adds environment variables.
    """
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "script.py")
        with open(path, "w") as f:
            f.write(textwrap.dedent(source))
        proc = subprocess.run(
            [sys.executable, path],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture
def script():
    return run_script


@pytest.fixture
def garbage_collected_once():
    """One full collection before a property test's examples, not one per example: earlier
    tests' cyclic garbage (a profiler among it) is gone before the first example counts what
    is alive, and the examples free their own objects by reference counting. A full
    collection late in the suite walks everything every test module imported (0.3 s each),
    so one per example cost 10-13 s per test and interpreter. Use it with
    `suppress_health_check=[HealthCheck.function_scoped_fixture]`: once per test is the point.
    """
    import gc

    gc.collect()


def _wait_child(pid: int, timeout: int = 60) -> int:
    """waitpid with a deadline: a child that deadlocks is killed and the test fails."""

    def expired(*_):
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(timeout)
    try:
        return os.waitpid(pid, 0)[1]
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail(f"forked child {pid} did not end within {timeout} s (deadlock)")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def wait_child():
    """``wait_child(pid, timeout=60)``: the exit status of a forked child, failing the test
    (and killing the child) if it has not ended by then."""
    return _wait_child
