"""Files from strangers: loading never runs code from a file and never takes memory the file
cannot justify, through every loader and every CLI command, whatever the file is called.

Memory snapshots are what people attach to bug reports. A pickle is a program (GLOBAL names
a callable, REDUCE calls it): `trace.load` used to fall back to `pickle.load` for opcodes its
reader did not know, so a snapshot-shaped pickle with a `__reduce__` payload ran. And its
reader grew its memo table to any index a file named: 6 bytes of LONG_BINPUT made it take
4 MiB, a 12 KB file gigabytes, and under `ulimit -v` the process aborted. Every pickle now
passes `_core.trace.check_snapshot_pickle` before anything reads it (plain data only, every table
bounded by the file's size) and the fallback for protocols 0 and 1 refuses every global. The
bombs read by a process whose address space is limited are in
tests/integration/test_load_safety_processes.py.
"""

from __future__ import annotations

import atexit
import gzip
import json
import os
import pickle
import shutil
import tempfile
from pathlib import Path

import paths
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pickle_bombs import laughs

import memlab_rs
import memlab_rs.cli
import memlab_rs.trace as trace
from memlab_rs import _core

NAMES = ["snap.pickle", "snap.pkl", "snap.json", "snap.json.gz", "snap.gz", "snap", "snap.txt"]


class _Payload:
    """Runs `command` when unpickled by a reader that resolves globals."""

    def __init__(self, call, argument):
        self.call, self.argument = call, argument

    def __reduce__(self):
        return (self.call, (self.argument,))


def _snapshot_shaped(payload, where: str) -> object:
    """A snapshot a viewer would accept, with `payload` hidden at `where`."""
    frame = {"filename": "/app/train.py", "line": 3, "name": "step"}
    entry = {
        "action": "alloc",
        "addr": 4096,
        "size": 512,
        "stream": 0,
        "time_us": 1,
        "frames": [frame],
    }
    snap = {
        "segments": [
            {
                "device": 0,
                "address": 4096,
                "total_size": 2 << 20,
                "segment_type": "small",
                "blocks": [
                    {
                        "size": 512,
                        "requested_size": 512,
                        "state": "active_allocated",
                        "frames": [frame],
                    }
                ],
            }
        ],
        "device_traces": [[entry]],
    }
    if where == "root":
        return payload
    if where == "key":
        snap["allocator_settings"] = payload
    elif where == "entry":
        entry["user_metadata"] = payload
    elif where == "frame":
        frame["filename"] = payload
    elif where == "block":
        snap["segments"][0]["blocks"][0]["state"] = payload
    return snap


def _malicious_pickles(marker: Path) -> list[tuple[str, bytes]]:
    """(label, bytes): payloads that create `marker` if anything unpickles them with
    globals resolved, at every protocol and in every part of a snapshot."""
    calls = [(os.system, f"touch {marker}"), (exec, f"open({str(marker)!r}, 'w').close()")]
    found = []
    for protocol in (0, 1, 2, 4, 5):
        for call, argument in calls:
            for where in ("root", "key", "entry", "frame", "block"):
                data = pickle.dumps(_snapshot_shaped(_Payload(call, argument), where), protocol)
                found.append((f"p{protocol}-{call.__name__}-{where}", data))
    return found


def _loaders(path: Path) -> list[tuple[str, object]]:
    return [
        ("trace.load", lambda: trace.load(path)),
        ("trace.load(exclude)", lambda: trace.load(str(path), exclude=[])),
        ("memlab_rs.load", lambda: memlab_rs.load(path)),
        ("results.load", lambda: memlab_rs.results.load(str(path))),
        ("merge_results", lambda: memlab_rs.merge_results([str(path), str(path)])),
        ("diff_results", lambda: memlab_rs.diff_results(str(path), str(path))),
    ]


def _cli_commands(path: Path) -> list[list[str]]:
    p = str(path)
    return [
        ["show", p],
        ["show", p, "--format", "json"],
        ["show", p, "--format", "html"],
        ["show", p, "--format", "csv"],
        ["diff", p, p],
        ["merge", p, p],
    ]


def _run_cli(args: list[str]) -> tuple[int, str]:
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        status = memlab_rs.cli.main(args)
    return status, err.getvalue()


def test_no_loader_and_no_command_runs_code_from_a_file(tmp_path):
    marker = tmp_path / "PWNED"
    payloads = _malicious_pickles(marker)
    # Each payload under every name: pickle, JSON and gzip names, none at all.
    for label, data in payloads:
        for name in NAMES:
            path = tmp_path / f"{label}-{name}"
            path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
            for loader, load in _loaders(path):
                with pytest.raises(ValueError) as refused:
                    load()
                assert not marker.exists(), (label, name, loader)
                message = str(refused.value)
                assert str(path.name) in message or "result" in message, (loader, message)
            path.unlink()
    # The CLI: one line, status 2, for every command and format (a subset of the payloads
    # under every name: each command costs an argument parse and a render).
    for label, data in payloads[::7]:
        for name in NAMES:
            path = tmp_path / f"{label}-{name}"
            path.write_bytes(data)
            for args in _cli_commands(path):
                status, err = _run_cli(args)
                assert not marker.exists(), (label, name, args)
                assert status == 2, (args, err)
                assert err.count("\n") == 1 and "Traceback" not in err, err
            path.unlink()


def test_the_refusal_names_the_opcode_and_says_nothing_runs(tmp_path):
    path = tmp_path / "bug-report.pickle"
    path.write_bytes(pickle.dumps(_snapshot_shaped(_Payload(os.system, "true"), "key"), 4))
    with pytest.raises(ValueError) as refused:
        trace.load(path)
    message = str(refused.value)
    assert "bug-report.pickle" in message
    assert "STACK_GLOBAL (0x93), which imports or calls code" in message
    assert "never runs code from a file" in message


def test_a_snapshot_read_later_is_checked_again(tmp_path):
    """A result loaded from a good file reads its dict from the file only when asked; a
    file swapped meanwhile is refused then, not unpickled."""
    marker = tmp_path / "PWNED"
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(_snapshot_shaped(None, "none"), 4))
    result = trace.load(path)
    assert result._snapshot is None
    path.write_bytes(
        pickle.dumps(_snapshot_shaped(_Payload(os.system, f"touch {marker}"), "key"), 4)
    )
    with pytest.raises(ValueError, match="imports or calls code"):
        result.snapshot  # noqa: B018
    with pytest.raises(ValueError, match="imports or calls code"):
        result.save(tmp_path / "out.json")
    assert not marker.exists()


def test_the_checker_bounds_the_expansion_of_what_it_passes(tmp_path):
    """What passes expands to at most 64 values per byte (plus 2**20): the walk the
    analysis or a JSON export makes of it is linear in the file. The laughs of n levels
    hold 3 * 2**n - 1 values (l0 holds 2, each level 1 + twice the one below)."""
    path = tmp_path / "laughs.pickle"
    for levels in range(1, 40):
        data = laughs(levels)
        path.write_bytes(data)
        values = 3 * 2**levels - 1
        if values <= 64 * len(data) + (1 << 20):
            checked = json.loads(_core.trace.check_snapshot_pickle(str(path)))
            assert checked == {"protocol": 4, "values": values}
        else:
            with pytest.raises(ValueError, match="pickle bomb"):
                _core.trace.check_snapshot_pickle(str(path))


def test_protocols_0_and_1_are_read_as_plain_data(tmp_path):
    """The text protocols pass the checker and are read by the unpickler that refuses every
    global: the same report as the dict."""
    frame = {"filename": "/app/train.py", "line": 3, "name": "step"}
    snap = {
        "segments": [],
        "device_traces": [
            [{"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "frames": [frame]}]
        ],
    }
    for protocol in (0, 1):
        path = tmp_path / f"p{protocol}.pickle"
        path.write_bytes(pickle.dumps(snap, protocol))
        assert json.loads(_core.trace.check_snapshot_pickle(str(path)))["protocol"] == 0
        assert trace.load(path).text() == trace.load(snap).text()


# -- fuzzing ---------------------------------------------------------------------------------

FIXTURES = paths.FIXTURES / "trace"
FUZZ = settings(
    max_examples=int(150 * float(os.environ.get("MEMLAB_RS_FUZZ_SCALE", "1"))),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _bases() -> list[bytes]:
    with open(FIXTURES / "mlp_adam.pickle", "rb") as f:
        snapshot = pickle.load(f)["snapshot"]  # our own fixture, trusted
    small = dict(snapshot, device_traces=[snapshot["device_traces"][0][:40]])
    return [pickle.dumps(small, p) for p in (0, 2, 4, 5)] + [pickle.dumps(snapshot, 4)]


BASES = _bases()


@st.composite
def mutated(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        how = draw(st.sampled_from(["flip", "cut", "insert", "delete", "repeat"]))
        if how == "flip" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif how == "cut":
            del data[at:]
        elif how == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=12))
        elif how == "delete":
            del data[at : at + draw(st.integers(1, 64))]
        elif how == "repeat":
            data[at:at] = data[at : at + draw(st.integers(1, 256))] * draw(st.integers(1, 8))
    return bytes(data)


def _load_and_use(path: Path) -> None:
    """trace.load and everything a user does with the result next: the only exception a
    damaged file may give is a ValueError."""
    try:
        result = trace.load(path)
        result.text()
        result.to_json()
        for device in result.devices:
            result.rows(device)
            result.timeline(device)
        result.snapshot  # noqa: B018  (the plain-data unpickler, for a streamed file)
        result.save(path.with_suffix(".json.gz"))
        memlab_rs.load(path.with_suffix(".json.gz")).text()
    except ValueError:
        pass


@FUZZ
@given(data=mutated())
def test_mutated_snapshots_load_or_give_a_value_error(data):
    path = Path(FUZZ_DIR) / "mutated.pickle"
    path.write_bytes(data)
    _load_and_use(path)


# Opcodes with arguments, data and code alike: random pickle programs.
_OPS = [
    b"N",
    b"\x88",
    b"K\x07",
    b"J\x01\x00\x00\x00",
    b"\x8a\x01\x05",
    b"G" + bytes(8),
    b"\x8c\x04name",
    b"\x8c\x06frames",
    b"\x8c\x06action",
    b"\x8c\x05alloc",
    b"X\x01\x00\x00\x00a",
    b"C\x01z",
    b"I12\n",
    b"F1.5\n",
    b"S'x'\n",
    b"Vy\n",
    b"]",
    b"}",
    b")",
    b"(",
    b"a",
    b"e",
    b"s",
    b"u",
    b"l",
    b"d",
    b"t",
    b"\x85",
    b"\x86",
    b"\x87",
    b"0",
    b"1",
    b"2",
    b"\x94",
    b"q\x00",
    b"q\x01",
    b"r\x02\x00\x00\x00",
    b"h\x00",
    b"h\x01",
    b"j\x02\x00\x00\x00",
    b"p3\n",
    b"g3\n",
    b"\x8f",
    b"\x90",
    b"\x91",
    b"cos\nsystem\n",
    b"\x93",
    b"R",
    b"b",
    b"\x81",
    b"\x92",
    b"o",
    b"ibuiltins\nexec\n",
    b"P1\n",
    b"Q",
    b"\x82\x01",
    b"\x95\x10\x00\x00\x00\x00\x00\x00\x00",
]


class _Recording(pickle.Unpickler):
    """Python's unpickler that records which globals a program asks for (and gives none)."""

    asked: list = []

    def find_class(self, module, name):
        self.asked.append((module, name))
        raise pickle.UnpicklingError("no globals here")

    def persistent_load(self, pid):
        self.asked.append(("persistent", pid))
        raise pickle.UnpicklingError("no persistent ids here")


@FUZZ
@given(
    ops=st.lists(st.sampled_from(_OPS), max_size=24),
    proto=st.sampled_from([b"", b"\x80\x02", b"\x80\x04"]),
)
def test_random_pickle_programs_never_reach_code(ops, proto):
    """Whatever program asks Python's unpickler for a global or a persistent id is refused
    by the checker; whatever passes the checker loads with no exception but a ValueError."""
    data = proto + b"".join(ops) + b"."
    path = Path(FUZZ_DIR) / "program.pickle"
    path.write_bytes(data)
    _Recording.asked = []
    import io

    try:
        _Recording(io.BytesIO(data)).load()
    except Exception:
        pass
    try:
        _core.trace.check_snapshot_pickle(str(path))
        passed = True
    except ValueError:
        passed = False
    if _Recording.asked:
        assert not passed, (data, _Recording.asked)
    _load_and_use(path)


FUZZ_DIR = tempfile.mkdtemp(prefix="memlab_rs_fuzz_")
atexit.register(shutil.rmtree, FUZZ_DIR, ignore_errors=True)
