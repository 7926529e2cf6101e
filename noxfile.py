"""The whole test suite on every CPython from 3.9 to 3.13 this machine has (`make test` runs it).

Run it through `make test`, which first builds the extension once: `make build` makes the
release wheel (cp39-abi3, manylinux2014, linked by zig) under target/wheels, and every session
installs that same wheel.
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

The `wheel` session (`make wheel`, and `make test` runs it) checks the release wheel and the
sdist as users get them: the wheel is manylinux2014 (auditwheel agrees), installs into a clean
environment with no Rust toolchain on PATH and works there; the sdist holds the sources and
every Python file the wheel installs (`make build` built the wheel from it).

Examples:
    make test                                   # everything, every Python found
    .venv/bin/nox -p 3.12                       # one Python (after `make build`)
    .venv/bin/nox -p 3.9 -- tests/unit/text/test_size.py -x   # arguments after -- go to pytest
    .venv/bin/nox -s wheel                      # release wheel and sdist (after `make build`)
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
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
    # Bytecode is written as modules are first imported: uv writes no .pyc, and where
    # PYTHONDONTWRITEBYTECODE is set (this project's machines set it) nothing would, so
    # every interpreter a test starts would compile torch's sources again (5.4 s to import
    # torch on 3.13 instead of 2.3-3.3 s). An empty value turns it off for the session and
    # the interpreters it starts. Not uv's --compile-bytecode: it compiles all of torch,
    # 33 s of CPU per environment, where the modules the suite imports take about 2 s.
    session.env["PYTHONDONTWRITEBYTECODE"] = ""
    if os.environ.get("MEMLAB_RS_ENVIRONMENTS_ONLY"):
        # `make test` makes the environments while the wheel builds (Makefile: test-envs):
        # the dependencies now, the wheel when the session runs.
        session.install("-r", str(REQUIREMENTS))
        return
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
    session.run("pytest", *(session.posargs or _test_paths(str(session.python))))


# The process tests whose behaviour depends on the interpreter: the line profiler's hook
# (settrace up to 3.11, sys.monitoring from 3.12), the gc walk's path (the collector's lists
# up to 3.11, PyUnstable_GC_VisitObjects from 3.12), and what forks, threads and interpreter
# exit do around the CPU allocator hook and a running trace. They run on the oldest and the
# newest CPython found; every other file of tests/integration runs once.
INTERPRETER_SENSITIVE = [
    "tests/integration/test_line_profiler_processes.py",
    "tests/integration/test_gc_walk_processes.py",
    "tests/integration/test_cpu_dispatch_processes.py",
    "tests/integration/test_cpu_allocator_robust.py",
    "tests/integration/test_trace_processes.py",
]


# The unit tests of what works on data alone (the results' files, the text helpers, the
# command line's rendering, the estimate's replay, the doctor's and the trace's analyses,
# readers and renderers, merged and compared tensor reports): Rust and Python over data,
# never the interpreter's frames, hooks or collector. They run on the newest CPython, and
# those of NEUTRAL_BUT_TORCH_SENSITIVE on the oldest too (its older torch); every other unit
# test runs on every CPython. That every module imports on every CPython (the syntax at both
# ends) is tests/unit/test_every_module_imports.py's.
INTERPRETER_NEUTRAL_UNIT = [
    "tests/unit/results",
    "tests/unit/text",
    "tests/unit/cli",
    "tests/unit/estimate",
    "tests/unit/doctor/test_fragmentation.py",
    "tests/unit/doctor/test_leaks_analysis.py",
    "tests/unit/trace/test_memory_viz_export.py",
    "tests/unit/trace/test_trace.py",
    "tests/unit/trace/test_trace_paths.py",
    "tests/unit/trace/test_trace_render.py",
    "tests/unit/trace/test_trace_stream.py",
    "tests/unit/trace/test_trace_views.py",
    "tests/unit/tensor_report/test_merge_and_diff.py",
    "tests/unit/tensor_report/test_saved_report.py",
]


# Of INTERPRETER_NEUTRAL_UNIT, what depends on torch's version: the estimate runs the step on
# torch's fake tensors and meta kernels, which the oldest CPython's torch (2.8) has older.
NEUTRAL_BUT_TORCH_SENSITIVE = ["tests/unit/estimate"]


# tests/contract runs on the newest CPython; this part of it on the oldest too: the user's
# operations (deepcopy, pickle, torch.compile's backends) with each tool attached, which the
# oldest CPython's older torch does differently.
CONTRACT_ON_BOTH_ENDS = ["tests/contract/test_tools_attached.py"]


# The process tests that run once go to the second newest CPython, except these, which go
# to the third newest, so that the two lanes of `make test` (.ci/nox_lanes.py: the newest,
# then the third and fourth newest, beside the oldest, then the second newest) end together.
# Measured on the 2-core machine: with every one on the second newest, lanes of 13.1 and
# 11.2 min; with this file and test_notebooks.py moved, 11.3 and 12.0.
ONCE_ON_THIRD_NEWEST = [
    "tests/integration/test_pytest_plugin.py",
]


def _test_paths(version: str) -> list[str]:
    """What a session tests. Every CPython: the in-process tests of what touches the
    interpreter (tests/unit less INTERPRETER_NEUTRAL_UNIT), and tests/gpu (skipped without
    CUDA). The newest found: all of tests/unit; the oldest: NEUTRAL_BUT_TORCH_SENSITIVE too.
    Both: the process tests that depend on the interpreter (INTERPRETER_SENSITIVE: both
    line-profiler hooks, both gc-walk paths). The newest: the docs, stubs and public API
    (tests/contract; its CONTRACT_ON_BOTH_ENDS on the oldest too). The second newest
    (ONCE_ON_THIRD_NEWEST: the third newest): the other process tests (the CLI end to end,
    pytester, torchrun/gloo, notebooks, fresh-interpreter first use), which behave alike on
    every CPython and cost most of a session's time (importing torch in fresh interpreters),
    so they run once."""
    found = _interpreters_found()
    paths = ["tests/unit", "tests/gpu"]
    if version == found[-1]:
        paths += ["tests/contract", *INTERPRETER_SENSITIVE]
    elif version == found[0]:
        paths += [*CONTRACT_ON_BOTH_ENDS, *INTERPRETER_SENSITIVE]
        only_newest = [p for p in INTERPRETER_NEUTRAL_UNIT if p not in NEUTRAL_BUT_TORCH_SENSITIVE]
        paths += [f"--ignore={p}" for p in only_newest]
    else:
        paths += [f"--ignore={p}" for p in INTERPRETER_NEUTRAL_UNIT]
    once = found[-2] if len(found) > 1 else found[-1]
    third = found[-3] if len(found) > 2 else once
    others = sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "integration").glob("test_*.py")
    )
    for path in others:
        if path in INTERPRETER_SENSITIVE:
            continue
        if version == (third if path in ONCE_ON_THIRD_NEWEST else once):
            paths.append(path)
    return paths


# The release wheel and the sdist: `nox -s wheel` (`make wheel`; `make test` runs it too).

# manylinux2014 is glibc 2.17 and newer: RHEL/Rocky 8 (2.28) and Ubuntu 20.04 (2.31) among
# them. `make build` makes the wheel (zig links it, see the Makefile).
MAX_GLIBC = (2, 17)
# Ignored, and on the filesystem of uv's cache, so that torch is hard-linked, not copied.
CHECKS = ROOT / "target" / "wheel-check"
# What building a wheel needs from the sdist, besides every tracked file under src/ and python/.
SDIST_NEEDS = ["Cargo.toml", "Cargo.lock", "pyproject.toml", "README.md", "LICENSE"]
# Run by the clean environment's Python with no Rust on PATH: the wheel imports and _core works.
USE_THE_WHEEL = """\
import shutil, sys
assert shutil.which("cargo") is None and shutil.which("rustc") is None, "Rust is on PATH"
import torch
import memlab_rs
from memlab_rs import _core
assert memlab_rs.__file__.startswith(sys.prefix), f"not this environment's: {memlab_rs.__file__}"
assert memlab_rs.readable_size(4194304) == "4.00M", memlab_rs.readable_size(4194304)
model = torch.nn.Linear(1000, 1000)
report = memlab_rs.MemReporter(model).collect(device="cpu")
sizes = {row.name: row.bytes for row in report.rows}
assert sizes.get("weight") == 4_000_000 and sizes.get("bias") == 4_000, sizes
print(f"  python {sys.version.split()[0]} | torch {torch.__version__}", end=" ")
print(f"| memlab_rs {_core.__version__}")
print(f"  memlab_rs from {memlab_rs.__file__}")
print("  shutil.which('cargo') and shutil.which('rustc'): None")
print(f"  readable_size(4194304) = {memlab_rs.readable_size(4194304)!r}")
print(f"  MemReporter(nn.Linear(1000, 1000)): weight {sizes['weight']} B, bias {sizes['bias']} B")
"""


def _tool(name: str) -> str:
    """A program `make` installed into .venv/bin, else one beside this nox, else on PATH."""
    for folder in (ROOT / ".venv" / "bin", Path(sys.executable).parent):
        if os.access(folder / name, os.X_OK):
            return str(folder / name)
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: `make build` installs it (requirements-dev.txt)")
    return found


def _without_rust() -> dict[str, str]:
    """This process's environment with no Rust toolchain: every PATH folder holding cargo or
    rustc is dropped, and so are rustup's and cargo's variables (and any active venv's)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CARGO", "RUSTUP", "RUSTC"))
        and key not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    }
    folders = env.get("PATH", "").split(os.pathsep)
    has_rust = lambda d: any(os.path.exists(os.path.join(d, t)) for t in ("cargo", "rustc"))  # noqa: E731
    env["PATH"] = os.pathsep.join(d for d in folders if d and not has_rust(d))
    for tool in ("cargo", "rustc"):
        found = shutil.which(tool, path=env["PATH"])
        assert found is None, f"{tool} is still on the stripped PATH: {found}"
    return env


def _check_manylinux(session: nox.Session, wheel: Path) -> None:
    """The wheel's name says cp39-abi3 and manylinux_2_17, and auditwheel agrees with its binary."""
    arch = platform.machine()
    _, _, python_tag, abi_tag, platforms = wheel.name[: -len(".whl")].split("-")
    if (python_tag, abi_tag) != ("cp39", "abi3") or f"manylinux_2_17_{arch}" not in platforms:
        session.error(f"{wheel.name}: expected cp39-abi3 and manylinux_2_17_{arch} (make build)")
    shown = str(session.run(_tool("auditwheel"), "show", str(wheel), silent=True))
    print(shown.strip())
    text = " ".join(shown.split())  # auditwheel wraps its lines
    consistent = r'consistent with the following platform tag: "manylinux_(\d+)_(\d+)_(\w+)"'
    tag = re.search(consistent, text)
    if tag is None:
        session.error("auditwheel show found no manylinux tag for the wheel")
    if (int(tag[1]), int(tag[2])) > MAX_GLIBC or tag[3] != arch:
        session.error(f"auditwheel: manylinux_{tag[1]}_{tag[2]}_{tag[3]}, not manylinux2014")
    versions = [
        (int(major), int(minor)) for major, minor in re.findall(r"GLIBC_(\d+)\.(\d+)", text)
    ]
    if not versions:
        session.error(
            "auditwheel show listed no glibc symbol version: is the wheel's binary there?"
        )
    newest = max(versions)
    if newest > MAX_GLIBC:
        session.error(f"the wheel needs GLIBC_{newest[0]}.{newest[1]}, newer than 2.17")
    session.log(
        f"auditwheel: manylinux_{tag[1]}_{tag[2]}_{arch}; newest glibc symbol version "
        f"GLIBC_{newest[0]}.{newest[1]} (manylinux2014 allows 2.17)"
    )


def _install_without_rust(session: nox.Session, wheel: Path, version: str) -> None:
    """The wheel into a new, empty environment with no Rust on PATH; then it must work."""
    venv = CHECKS / f"clean-{version}"
    shutil.rmtree(venv, ignore_errors=True)
    env = _without_rust()
    uv, python = _tool("uv"), str(venv / "bin" / "python")
    session.log(f"CPython {version}: a clean environment, no cargo or rustc on PATH")
    run = dict(env=env, include_outer_env=False)
    interpreter = str(shutil.which(f"python{version}"))
    session.run(uv, "venv", "--quiet", "--python", interpreter, str(venv), **run)
    # --no-build: memlab_rs and every dependency must come as wheels: nothing compiles.
    session.run(uv, "pip", "install", "-q", "--no-build", "--python", python, str(wheel), **run)
    script = CHECKS / "use_the_wheel.py"
    script.write_text(USE_THE_WHEEL)
    session.run(python, str(script), **run)


def _tracked(*folders: str) -> list[str]:
    """The files git tracks under folders (a tree that is not a checkout: the files there)."""
    try:
        listing = ["git", "ls-files", "--", *folders]
        out = subprocess.run(listing, cwd=ROOT, capture_output=True, text=True, check=True)
        return out.stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        files = [p for f in folders for p in (ROOT / f).rglob("*") if p.is_file()]
        junk = lambda p: "__pycache__" in p.parts or p.suffix in (".so", ".pyc")  # noqa: E731
        return [str(p.relative_to(ROOT)) for p in files if not junk(p)]


def _package_files(wheel: Path) -> set[str]:
    """What a wheel installs, less its .dist-info (its RECORD differs from build to build)."""
    with zipfile.ZipFile(wheel) as archive:
        return {n for n in archive.namelist() if ".dist-info/" not in n}


def _check_sdist(session: nox.Session, wheel: Path) -> None:
    """The sdist `make build` made holds what a build needs; the wheel was built from it
    (.ci/wheel_from_sdist.py), so a file a build needs and the sdist lacks failed that build,
    and every Python file the wheel installs came from the sdist."""
    sdists = sorted(WHEELS.glob("memlab_rs-*.tar.gz"))
    if len(sdists) != 1:
        session.error(f"expected one memlab_rs sdist beside the wheel in {WHEELS}: make build")
    sdist = sdists[0]
    top = sdist.name[: -len(".tar.gz")] + "/"
    with tarfile.open(sdist) as archive:
        held = {n[len(top) :] for n in archive.getnames() if n.startswith(top)}
    sources = _tracked("src", "python")
    missing = [f for f in SDIST_NEEDS + sources if f not in held]
    if not sources or missing:
        session.error(f"{sdist.name} lacks {missing or 'src/ and python/'}")
    python_files = {f"python/{n}" for n in _package_files(wheel) if n.endswith(".py")}
    not_from_sdist = sorted(python_files - held)
    if not_from_sdist:
        session.error(f"the wheel installs files the sdist lacks: {not_from_sdist}")
    session.log(
        f"{sdist.name}: {len(held)} files; {', '.join(SDIST_NEEDS)} and all "
        f"{len(sources)} tracked files under src/ and python/ are there, and the wheel's "
        f"{len(python_files)} Python files (the wheel was built from it: make build)"
    )


@nox.session(python=False)
def wheel(session: nox.Session) -> None:
    """The release wheel and the sdist, checked as users get them (the module docstring)."""
    release = _the_wheel()
    session.log(f"release wheel: {release.name}")
    _check_manylinux(session, release)
    # The abi3 floor: the tests sessions install the same wheel on every CPython found.
    _install_without_rust(session, release, _interpreters_found()[0])
    _check_sdist(session, release)
    session.log("release wheel and sdist: every check passed")
