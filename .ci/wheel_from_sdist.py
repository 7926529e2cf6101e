"""Build the release wheel from the sdist, as PyPA's `python -m build` does (`make build`).

    python .ci/wheel_from_sdist.py OUT_DIR

1. `maturin sdist` writes the sdist into OUT_DIR (the one a release uploads);
2. it is unpacked under target/sdist-build/;
3. `maturin build --release --zig --compatibility manylinux2014` builds the wheel from the
   unpacked sdist into OUT_DIR.

Why from the sdist: the wheel then proves the sdist complete (a file missing from it fails
this build) at no extra cost, where a second build of the sdist after the checkout's cost the
2-core machine about 50 s of every `make test`. noxfile.py's `wheel` session checks the
sdist's list of files and the wheel's tags and installation.

Incremental builds: maturin writes every file of the sdist with one fixed modification time
(reproducible archives), and cargo decides what to recompile by modification times, so a
changed source would look older than the last build. Each unpacked file takes the time of
the checkout's file it came from (the files are the same), and cargo sees what changed.
CARGO_TARGET_DIR is the checkout's target/: dependencies compile once for every build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UNPACKED = ROOT / "target" / "sdist-build"
MATURIN = str(Path(sys.executable).parent / "maturin")


def build_sdist(out: Path) -> Path:
    subprocess.run([MATURIN, "sdist", "--out", str(out)], cwd=ROOT, check=True)
    sdists = sorted(out.glob("memlab_rs-*.tar.gz"))
    if len(sdists) != 1:
        raise SystemExit(f"maturin sdist made {len(sdists)} memlab_rs sdists in {out}")
    return sdists[0]


def unpack(sdist: Path) -> Path:
    """The sdist unpacked, each file with its checkout file's modification time."""
    shutil.rmtree(UNPACKED, ignore_errors=True)
    with tarfile.open(sdist) as archive:
        members = archive.getmembers()
        if hasattr(tarfile, "data_filter"):  # 3.12, and 3.8.17+ / 3.11.4+ patch releases
            archive.extractall(UNPACKED, filter="data")
        else:
            archive.extractall(UNPACKED)  # our own sdist, made just above
    top = UNPACKED / sdist.name[: -len(".tar.gz")]
    for member in members:
        if not member.isfile():
            continue
        relative = Path(member.name).relative_to(top.name)
        original = ROOT / relative
        if original.is_file():
            stat = original.stat()
            os.utime(top / relative, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return top


def build_wheel(source: Path, out: Path) -> None:
    env = {
        **os.environ,
        "CARGO_TARGET_DIR": str(ROOT / "target"),
        # maturin's zig driver runs `python -m ziglang`: the Python that has it.
        "CARGO_ZIGBUILD_PYTHON_PATH": sys.executable,
    }
    command = [
        MATURIN, "build", "--release", "--quiet", "--zig", "--compatibility", "manylinux2014",
        "-o", str(out), "-m", str(source / "Cargo.toml"),
    ]  # fmt: skip
    subprocess.run(command, cwd=ROOT, env=env, check=True)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        raise SystemExit("usage: python .ci/wheel_from_sdist.py OUT_DIR")
    out = Path(argv[0]).resolve()
    shutil.rmtree(out, ignore_errors=True)
    sdist = build_sdist(out)
    build_wheel(unpack(sdist), out)
    wheels = sorted(out.glob("memlab_rs-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"building from {sdist.name} made {len(wheels)} wheels in {out}")
    print(f"{wheels[0].name} built from {sdist.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
