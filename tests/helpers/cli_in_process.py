"""`memlab-rs ARGS` run in this interpreter (``cli_in_process``), for the CLI's tests: the
function the console script calls, ``memlab_rs.cli.main``, without the process (a process
each costs an import of torch); and ``one_line_error``, the check of a usage error."""

from __future__ import annotations

import builtins
import contextlib
import importlib
import io
import os
import subprocess
import sys
import warnings
from pathlib import Path

import memlab_rs.cli

# The module behind @profile (the package's `profile` is the decorator).
PROFILE_MODULE = importlib.import_module("memlab_rs.line_profiler.global_profiler")


def interpreter_state() -> dict[str, object]:
    """The working directory, what `memlab-rs run` changes in its process before the script
    starts (sys.argv, sys.path, __main__, builtins.profile, the global line profiler), and
    what would leave a profiler on: an in-process call must leave all of it as it was."""
    return {
        "cwd": os.getcwd(),
        "sys.argv": list(sys.argv),
        "sys.path": list(sys.path),
        "__main__": sys.modules.get("__main__"),
        "builtins.profile": getattr(builtins, "profile", None),
        "trace function": sys.gettrace(),
        "profile function": sys.getprofile(),
        "global line profiler": (
            PROFILE_MODULE._global,
            PROFILE_MODULE._global_device,
            list(PROFILE_MODULE._print_at_exit),
        ),
    }


def cli_in_process(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`memlab-rs ARGS` run in ``cwd`` by ``memlab_rs.cli.main``, the function the console
    script calls, in this interpreter: its exit status (an argparse exit's too), stdout and
    stderr, as ``cli`` gives them. Warnings go to stderr as Python's default filters would
    print them in the console script's process. For show, diff, merge, help, and run's
    errors found before a script is looked at (a `run` that reaches the script needs
    ``cli``: it makes the script this interpreter's __main__)."""
    if args[:1] == ("run",):
        args = ("run", "--device", "cpu", *args[1:])
    before = interpreter_state()
    stdout, stderr = io.StringIO(), io.StringIO()
    os.chdir(cwd)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.resetwarnings()  # Python's default filters, not pytest's
            warnings.simplefilter("default")
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                             ResourceWarning):  # fmt: skip
                warnings.simplefilter("ignore", category)
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                try:
                    status = memlab_rs.cli.main(list(args))
                except SystemExit as stop:  # argparse: --help, --version, a usage error
                    status = 0 if stop.code is None else stop.code
        for w in caught:
            stderr.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno))
    finally:
        left_in = os.getcwd()
        os.chdir(before["cwd"])  # type: ignore[arg-type]
        after = interpreter_state()
        sys.argv[:], sys.path[:] = before["sys.argv"], before["sys.path"]  # type: ignore[index]
        sys.modules["__main__"] = before["__main__"]  # type: ignore[assignment]
    # (put back above, so that a leak fails this test alone)
    assert os.path.samefile(left_in, cwd) and after == before
    assert isinstance(status, int), status
    return subprocess.CompletedProcess(
        ["memlab-rs", *args], status, stdout.getvalue(), stderr.getvalue()
    )


def one_line_error(proc: subprocess.CompletedProcess, command: str) -> str:
    """The status is 2 and stderr is one line naming the command: that line."""
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"memlab-rs {command}: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]
