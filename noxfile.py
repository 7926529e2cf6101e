"""The whole test suite on every CPython from 3.9 to 3.13 this machine has (`make test` runs it).

Run it through `make test`, which first builds the extension once: `maturin build --release`
makes an abi3 wheel (cp39-abi3) under target/wheels, and every session installs that same wheel.
The tests import what users install, never the sources under python/ (pytest runs with
--import-mode=importlib from the repository root, where no `memlab_rs` package lies).

Interpreters: a `pythonX.Y` on PATH, or pyenv's installs (~/.pyenv/versions/X.Y.Z): pyenv's
shims only answer for the versions selected with `pyenv global`, so the real folders are put
ahead of them. A version the machine lacks is skipped with a notice, also in CI (nox would
otherwise turn a missing interpreter into an error when CI is set); nothing is downloaded.

Environments: uv makes them. torch from PyPI is its CUDA build, about 5 GB a set with the
nvidia-* wheels; uv unpacks each wheel once into its cache (~/.cache/uv) and hard-links it into
each environment, so the five environments cost one download and one unpack per distinct wheel.
pip/uv pick the newest torch with wheels for each Python (3.9 gets an older one, >= 2.1).

Examples:
    make test                                   # everything, every Python found
    .venv/bin/nox -p 3.12                       # one Python (after `make build`)
    .venv/bin/nox -p 3.9 -- tests/test_size.py -x   # arguments after -- go to pytest
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import nox

PYTHONS = ["3.9", "3.10", "3.11", "3.12", "3.13"]
ROOT = Path(__file__).resolve().parent
WHEELS = ROOT / "target" / "wheels"
REQUIREMENTS = ROOT / "requirements-test.txt"

nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "uv"
# Skip, with nox's printed notice, a Python the machine does not have: CI machines differ.
nox.options.error_on_missing_interpreters = False
# Only PyPI is reachable: never fetch an interpreter, use the ones installed.
nox.options.download_python = "never"
# A second `make test` reuses the environments (uv still brings them up to date).
nox.options.reuse_venv = "yes"


def _pyenv_bin(version: str) -> Path | None:
    """The bin folder of pyenv's newest CPython X.Y install, if there is one."""
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    patch = re.compile(rf"^{re.escape(version)}\.(\d+)$")  # 3.13.0, not 3.13.0t or 3.130.1
    found = [(int(m.group(1)), d) for d in root.glob(f"{version}.*") if (m := patch.match(d.name))]
    for _, folder in sorted(found, reverse=True):
        if os.access(folder / "bin" / f"python{version}", os.X_OK):
            return folder / "bin"
    return None


def _put_pyenv_interpreters_on_path() -> None:
    """Put pyenv's real interpreter folders ahead of PATH (ahead of its shims, too)."""
    folders = [str(b) for b in map(_pyenv_bin, PYTHONS) if b is not None]
    if folders:
        os.environ["PATH"] = os.pathsep.join([*folders, os.environ.get("PATH", "")])


_put_pyenv_interpreters_on_path()


def _interpreters_found() -> list[str]:
    """The versions of PYTHONS that run here (a pyenv shim on PATH may not)."""
    found = []
    for version in PYTHONS:
        exe = shutil.which(f"python{version}")
        if exe and subprocess.run([exe, "-c", ""], capture_output=True).returncode == 0:
            found.append(version)
    return found


if not _interpreters_found():
    # Every session would be skipped and nothing tested, yet nox would exit 0.
    raise SystemExit(f"no CPython of {', '.join(PYTHONS)} found on PATH or in pyenv")


def _the_wheel() -> Path:
    wheels = sorted(WHEELS.glob("memlab_rs-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(
            f"expected exactly one memlab_rs wheel in {WHEELS}, found {len(wheels)}: "
            "run `make build` first (it rebuilds that folder)"
        )
    return wheels[0]


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """Install the built wheel and the test dependencies, then run pytest on tests/."""
    wheel = str(_the_wheel())
    if session.venv_backend == "uv":
        # The wheel's version rarely changes between builds: reinstall it every time.
        session.install("--reinstall-package", "memlab_rs", "-r", str(REQUIREMENTS), wheel)
    else:  # pip: the dependencies, then the wheel over any earlier build
        session.install("-r", str(REQUIREMENTS), wheel)
        session.install("--force-reinstall", "--no-deps", wheel)
    # Say what is under test, and fail early if the wheel is not the module that imports.
    session.run(
        "python",
        "-c",
        "import sys, torch, memlab_rs; "
        "print('python', sys.version.split()[0], '| torch', torch.__version__, "
        "'| memlab_rs from', memlab_rs.__file__); "
        "assert 'site-packages' in memlab_rs.__file__, 'memlab_rs must come from the wheel'",
    )
    # `pytest`, not `python -m pytest`: -m would put the working directory on sys.path.
    # pytest exits 5 when it collected no test: that fails the session, as it should here.
    session.run("pytest", *(session.posargs or ["tests"]))
