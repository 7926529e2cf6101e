"""memlab_rs's pytest plugin as pytest loads it: the ``pytest11`` entry point ``memlab_rs``.

pytest imports this module in every run of every project where memlab_rs is installed, so it
imports neither memlab_rs's tools nor torch (torch's import takes 1.5 s, and the tools install
a gc callback). It registers the options and the markers, and hands over to
``memlab_rs.integrations.pytest_plugin`` only when asked: ``--memlab`` or ``--memlab-save``
given, or a collected test carrying ``limit_memory``, ``limit_cuda_memory`` or
``limit_leaks``. Otherwise no
hook of memlab_rs runs around any test. ``-p no:memlab_rs`` turns it off altogether.
"""

from __future__ import annotations

from typing import Any

import pytest

MARKERS = ("limit_memory", "limit_cuda_memory", "limit_leaks")
# The name the measuring plugin is registered under once it is asked for.
PLUGIN_NAME = "memlab_rs.measure"


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("memlab_rs", "memory of each test (memlab_rs)")
    group.addoption(
        "--memlab",
        action="store_true",
        default=False,
        help="measure the peak memory of every test's call (CPU tensors and each CUDA "
        "device) and list the tests with the highest peaks at the end",
    )
    group.addoption(
        "--memlab-top",
        type=int,
        default=5,
        metavar="N",
        help="how many tests --memlab lists per device (default: 5)",
    )
    group.addoption(
        "--memlab-save",
        default=None,
        metavar="DIR",
        help="measure every test's call and save each test's result in DIR, one file per "
        "test (memlab_rs.load reads them)",
    )
    group.addoption(
        "--memlab-oom",
        default=None,
        metavar="DIR",
        help="run every test's call under memlab_rs.oom_guard: a test that runs out of "
        "memory leaves a post-mortem in DIR (memlab-rs show reads it)",
    )


def pytest_configure(config: Any) -> None:
    config.addinivalue_line(
        "markers",
        "limit_memory(limit): fail the test if the CPU tensors its call allocates peak above "
        "limit, a size such as '512 MB' or '1.5GiB' or an int of bytes (memlab_rs)",
    )
    config.addinivalue_line(
        "markers",
        "limit_cuda_memory(limit, device=None): fail the test if the CUDA memory its call "
        "allocates peaks above limit on device (default: the current CUDA device) (memlab_rs)",
    )
    config.addinivalue_line(
        "markers",
        "limit_leaks(limit, calls=5, warmup=1, device=None): call the test's body warmup + "
        "calls times with the same fixtures and fail it if memory at one line grows at every "
        "call by more than limit bytes a call (CPU tensors, and the current CUDA device when "
        "torch sees one; device='cpu' or 'cuda:N' for one) (memlab_rs)",
    )
    top = config.getoption("memlab_top")
    if top < 1:
        raise pytest.UsageError(f"--memlab-top {top}: give a number of tests, 1 or more")
    _check_save_dir(config.getoption("memlab_save"))
    if config.getoption("memlab") or config.getoption("memlab_save") is not None:
        _measuring(config)
    oom_dir = config.getoption("memlab_oom")
    if oom_dir is not None:
        if not oom_dir:
            raise pytest.UsageError("--memlab-oom: give the folder to save post-mortems in")
        from memlab_rs.integrations.pytest_oom import OOMPlugin

        config.pluginmanager.register(OOMPlugin(oom_dir), "memlab_rs.oom")


@pytest.hookimpl(trylast=True)  # after other plugins and conftests have added their marks
def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    marked = [item for item in items if any(item.get_closest_marker(m) for m in MARKERS)]
    plugin = config.pluginmanager.get_plugin(PLUGIN_NAME)
    if plugin is None and not marked:
        return
    (plugin or _measuring(config)).check_limits(marked)


def _check_save_dir(folder: str | None) -> None:
    """``--memlab-save DIR`` must name a folder, existing or to be made: a usage error
    before any test runs otherwise (``os.makedirs`` on a file was an INTERNALERROR)."""
    import os

    if folder is None:
        return
    if not folder:
        raise pytest.UsageError("--memlab-save: give the folder to save each test's result in")
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise pytest.UsageError(
            f"--memlab-save {folder}: that is a file, not a folder; give a folder (it is "
            "made if missing) to save one result file per test in"
        )
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        raise pytest.UsageError(
            f"--memlab-save {folder}: cannot make that folder ({error})"
        ) from None


def _measuring(config: Any) -> Any:
    """Register the measuring plugin (this imports memlab_rs and torch)."""
    try:
        from memlab_rs.integrations.pytest_plugin import MemlabPlugin
    except TypeError as error:  # pluggy before 1.2 knows no new-style hook wrappers
        raise pytest.UsageError(
            f"memlab_rs's pytest plugin needs pytest 8 or newer ({error}): pip install -U pytest"
        ) from None

    plugin = MemlabPlugin(config)
    config.pluginmanager.register(plugin, PLUGIN_NAME)
    return plugin
