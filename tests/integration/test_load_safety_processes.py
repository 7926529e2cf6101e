"""Files from strangers read in bounded memory: the process-level tests of load safety
(moved from tests/unit/results/test_load_safety.py and test_load_safety_results.py, as each
runs a fresh interpreter). Snapshot-pickle bombs (a memo grown to any index a file names,
billion laughs, huge lengths) and a gzip bomb of a result file are refused by a process
whose address space is limited (RLIMIT_AS) to what it had plus a little: a ValueError, no
abort, no MemoryError.
"""

from __future__ import annotations

import gzip
import json
import pickle
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

from pickle_bombs import laughs
from result_samples import samples

import memlab_rs
from memlab_rs import results

# -- snapshot pickles (from tests/unit/results/test_load_safety.py) --------------------------------


def _memo_bomb(count: int) -> bytes:
    """LONG_BINPUT indices 2**20 apart: the old reader grew its memo 4 MiB per 6 bytes."""
    body = b"".join(b"r" + struct.pack("<I", (i + 1) << 20) for i in range(count))
    return b"\x80\x04]" + body + b"."


def _bombs() -> dict[str, bytes]:
    plain = {"segments": [], "device_traces": [[]]}
    return {
        "memo": _memo_bomb(2000),  # 12 KB
        "laughs": laughs(64),
        # the laughs as a snapshot's device_traces: a reader that walks them pays 2**40
        "laughs-in-snapshot": laughs(40)[:-1]
        + b"}(\x8c\x08segments]\x8c\x0ddevice_traces"
        + b"j"
        + struct.pack("<I", 40)
        + b"u.",
        "string-length": b"\x80\x04\x8d" + struct.pack("<Q", 1 << 62) + b"abc.",
        "frame-length": b"\x80\x04\x95" + struct.pack("<Q", 1 << 40) + b"}.",
        "long4": b"\x80\x04\x8b" + struct.pack("<I", 1 << 31) + b"\x01" * 64 + b".",
        "int-digits": b"(I" + b"9" * 100_000 + b"\nl.",
        "put-text": b"(lp99999999999\n.",
        "snapshot": pickle.dumps(plain, 4),
    }


def test_memory_bombs_are_refused_in_bounded_memory(tmp_path):
    """Each bomb is refused (or, the plain small snapshot, read) by a process whose address
    space is limited to what it had plus 256 MiB: no abort, no MemoryError, a ValueError,
    and resident memory grows by less than 32 MiB."""
    for name, data in _bombs().items():
        (tmp_path / f"{name}.pickle").write_bytes(data)
    code = f"""
        import os, resource, sys
        import memlab_rs.trace as trace
        def rss():
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (size + (256 << 20), resource.RLIM_INFINITY))
        before = rss()
        for name in sorted(os.listdir({str(tmp_path)!r})):
            path = os.path.join({str(tmp_path)!r}, name)
            try:
                found = trace.load(path)
                print(name, "read", found.devices)
            except ValueError as e:
                print(name, "refused", str(e).split(":")[-1][:60])
        print("grew", rss() - before)
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    for name in _bombs():
        verdict = lines[f"{name}.pickle"]
        if name == "snapshot":
            assert verdict.startswith("read"), verdict
        else:
            assert verdict.startswith("refused"), (name, verdict)
    assert int(lines["grew"]) < 32 << 20, proc.stdout


# -- result files (from tests/unit/results/test_load_safety_results.py) ----------------------------


def _gzip_bomb(path: Path, gib: int) -> None:
    """A result-shaped JSON text of ``gib`` GiB of zeros in a string, as gzip members (a
    gzip file may hold several, read one after the other): 64 MiB compressed once, repeated."""
    zeros = gzip.compress(b"0" * (64 << 20), compresslevel=9)
    with open(path, "wb") as f:
        f.write(gzip.compress(b'{"format": "memlab_rs.result", "schema": 1, "x": "'))
        for _ in range(16 * gib):
            f.write(zeros)
        f.write(gzip.compress(b'"}'))


def test_a_gzip_bomb_is_refused_in_bounded_memory(tmp_path):
    """A 1 MiB gzip file of 1 GiB of JSON (deflate compresses zeros 1,000 times): refused
    after 256 times its size, in a process whose address space has 512 MiB to spare, with no
    MemoryError; a real result compressed as well as results are still loads."""
    bomb = tmp_path / "bomb.json.gz"
    _gzip_bomb(bomb, 1)
    assert bomb.stat().st_size < 2 << 20
    code = f"""
        import os, resource
        import memlab_rs
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (size + (512 << 20), resource.RLIM_INFINITY))
        try:
            memlab_rs.load({str(bomb)!r})
        except ValueError as e:
            print("refused:", e)
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    limit = max(1 << 20, 256 * bomb.stat().st_size)
    assert proc.stdout == (
        f"refused: {bomb}: decompresses to more than {limit:,} bytes, 256 times its size: a "
        "gzip bomb, not a memlab_rs result (real ones compress less than 100 times)\n"
    )
    # Among the most compressible real results: a monitor's record of identical iterations.
    monitor = samples()["monitor"]
    data = monitor.to_data()
    rows = [{**data["rows"][0], "step": step} for step in range(1, 3001)]
    data.update(rows=rows, details=data["details"][:1] * len(rows))
    doc = {"format": results.FORMAT, "schema": 1, "kind": "monitor", "meta": monitor.meta}
    text = json.dumps({**doc, "data": data}).encode()
    path = tmp_path / "monitor.json.gz"
    path.write_bytes(gzip.compress(text))
    assert len(text) > 1 << 20 and len(text) > 50 * path.stat().st_size
    assert len(memlab_rs.load(path).rows()) == 3000
