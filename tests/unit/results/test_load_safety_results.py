"""Result files from strangers: whatever a JSON or gzip result file holds, loading it and
everything done with it next (rendering, merging, diffing, the CLI in every format) gives a
ValueError naming the problem, never another exception, and never takes memory or time the
file cannot justify.

A colleague fuzzed 6,248 runs of `memlab-rs show/diff/merge` over 117 damaged files: 639
ended in a traceback (`zlib.error` from a corrupt gzip, `RecursionError` from deep nesting,
`AttributeError` from a wrong type, `OverflowError` from a big integer). Now the text is
checked before parsing (`_core.check_result_json`: nesting, numbers, NaN and Infinity), a
gzip file may decompress to at most 256 times its size, and every kind's document is
checked against its schema (`memlab_rs._result_schema`) before its class sees a field.
tests/unit/results/test_load_safety.py does the same for snapshot pickles; a gzip bomb read
by a process whose address space is limited is in
tests/integration/test_load_safety_processes.py.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import gzip
import io
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from result_samples import samples, second_rank, use

import memlab_rs
import memlab_rs.cli
from memlab_rs import results

KINDS = sorted(["line_profile", "tensor_report", "trace", "monitor", "tracker", "estimate",
                "test_memory", "merged_line_profile", "merged_tensor_report",
                "fragmentation", "postmortem", "leaks", "plan"])  # fmt: skip
FUZZ = settings(
    max_examples=int(150 * float(os.environ.get("MEMLAB_RS_FUZZ_SCALE", "1"))),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ_DIR = Path(tempfile.mkdtemp(prefix="memlab_rs_fuzz_results_"))
atexit.register(shutil.rmtree, FUZZ_DIR, ignore_errors=True)


def documents() -> dict[str, dict[str, Any]]:
    return {kind: json.loads(results.dumps(result)) for kind, result in samples().items()}


def _run_cli(*args: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        status = memlab_rs.cli.main(list(args))
    return status, err.getvalue()


def _refused_in_one_line(status: int, err: str, args: Any) -> None:
    assert status in (0, 2), (args, status, err)
    if status == 2:
        assert err.count("\n") == 1 and "Traceback" not in err, (args, err)


def _rust_checked(kind: str) -> Any:
    """The room's submodule of ``_core`` that checks a kind's data (its serde derive), or
    None for a kind ``_result_schema`` checks."""
    return getattr(getattr(results.KINDS[kind], "__self__", None), "_rust", None)


def test_every_kind_has_a_schema_and_its_results_pass_it():
    """A kind's schema is its serde derive (a kind whose data Rust holds: its ``_rust``
    validates) or, until its room moves it there, ``_result_schema``'s."""
    from memlab_rs import _result_schema

    results.files._import_kinds()
    assert sorted(results.KINDS) == KINDS
    in_rust = sorted(k for k in KINDS if _rust_checked(k) is not None)
    # Every kind is checked, by its derive in Rust or by _result_schema in Python.
    assert sorted(set(_result_schema.SCHEMAS) | set(in_rust)) == KINDS
    for kind, doc in documents().items():
        rust = getattr(samples()[kind], "_rust", None)
        assert rust is not None or kind in _result_schema.SCHEMAS, f"{kind} has no schema"
        _result_schema.check(kind, doc["data"], doc["meta"])  # no ValueError
        if rust is not None:
            checked = rust.validate(json.dumps(doc["data"]))  # no ValueError
            # The data as Rust read it and wrote it back, where it hands it back (a trace's
            # snapshot, often hundreds of MB, is checked where it is read, without a copy).
            assert checked is None or json.loads(checked) == doc["data"], kind


# -- the JSON text and the gzip around it ----------------------------------------------------


def _saved(kind: str, tmp_path: Path, name: str = "r.json") -> Path:
    path = tmp_path / name
    samples()[kind].save(path)
    return path


def _text_with(doc: dict[str, Any], where: tuple[Any, ...], raw: str) -> str:
    """The document as JSON text with the value at ``where`` replaced by the text ``raw``
    (what json.dumps would never write: NaN, a deep nesting, a long number)."""
    marker = "__memlab_rs_marker__"
    changed = copy.deepcopy(doc)
    node = changed
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = marker
    return json.dumps(changed).replace(f'"{marker}"', raw)


def test_damaged_text_and_gzip_are_one_value_error(tmp_path):
    doc = documents()["line_profile"]
    value = ("data", "functions", 0, "lines", 1, 3, 0)  # a line's first value
    cases = {
        "deep": (_text_with(doc, value, "[" * 100_000 + "]" * 100_000), "nested more than 64"),
        "long int": (_text_with(doc, value, "9" * 40), "a number of more than 32 characters"),
        # serde_json reads an integer past u64 as a float, which no i64 field takes
        "huge int": (
            _text_with(doc, value, str(1 << 64)),
            "functions[0].lines[1][3][0]: invalid type: floating point `1.8446744073709552e+19`"
            ", expected i64",
        ),
        "NaN": (_text_with(doc, value, "NaN"), "NaN or Infinity"),
        "Infinity": (_text_with(doc, value, "-Infinity"), "NaN or Infinity"),
        "1e400": (_text_with(doc, value, "1e400"), "a number too large for a float"),
        "float": (
            _text_with(doc, value, "1.5"),
            "functions[0].lines[1][3][0]: invalid type: floating point `1.5`, expected i64",
        ),
        "wrong type": (
            _text_with(doc, ("data", "notices"), '{"a": 1}'),
            "notices: invalid type: map, expected a sequence",
        ),
        "not utf-8": (json.dumps(doc).replace("_grow", "_gr\udcffow", 1), "not UTF-8"),
        "unhashable kind": (_text_with(doc, ("kind",), '["line_profile"]'), "unknown result kind"),
        "unknown kind": (_text_with(doc, ("kind",), '"flame_graph"'), "unknown result kind"),
        "bool schema": (_text_with(doc, ("schema",), "true"), "bad schema version"),
    }
    path = tmp_path / "damaged.json"
    for label, (text, message) in cases.items():
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        for load in (memlab_rs.load, memlab_rs.trace.load, lambda p: memlab_rs.merge_results([p])):
            with pytest.raises(ValueError) as refused:
                load(path)
            assert str(path) in str(refused.value), (label, str(refused.value))
            if load is memlab_rs.load:
                assert message in str(refused.value), (label, str(refused.value))
        for args in (("show", str(path)), ("diff", str(path), str(path))):
            status, err = _run_cli(*args)
            assert status == 2 and err.count("\n") == 1 and message in err, (label, err)
    good = _saved("line_profile", tmp_path, "good.json.gz").read_bytes()
    gzip_cases = {
        "cut": good[: len(good) // 2],
        "flipped": good[:20] + bytes([good[20] ^ 0xFF]) + good[21:],
        "bad crc": good[:-8] + bytes(4) + good[-4:],
        "header only": good[:10],
    }
    for label, data in gzip_cases.items():
        path.write_bytes(data)
        with pytest.raises(ValueError, match="not a memlab_rs result file") as refused:
            memlab_rs.load(path)
        assert str(path) in str(refused.value), label
        status, err = _run_cli("show", str(path))
        assert status == 2 and err.count("\n") == 1, (label, err)


def test_a_huge_number_is_refused_at_once():
    """Parsing a 10,000,000-digit integer is quadratic on Python 3.9 and 3.10 (hours) and a
    ValueError of Python's own digit limit elsewhere; the check before parsing refuses it
    after 33 characters."""
    text = '{"format": "memlab_rs.result", "schema": 1, "kind": "line_profile", "x": '
    text += "7" * 10_000_000 + "}"
    started = time.perf_counter()
    with pytest.raises(ValueError, match="a number of more than 32 characters"):
        results.loads(text, "huge.json")
    assert time.perf_counter() - started < 2


# -- every field of every kind ---------------------------------------------------------------

_WORDS = ["alloc", "free_completed", "segment_alloc", "active_allocated", "cpu", "cuda", "+", ""]
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([-1, 0, 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(_WORDS)
    | st.text(max_size=6)
)
JSON_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path] if path else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:6]):
            found += _paths(item, (*path, i))
    return found


@st.composite
def damaged_documents(draw, kinds=tuple(KINDS), under: tuple[Any, ...] = ()) -> tuple[str, Any]:
    """(kind, a real document of that kind with one to three fields changed): replaced by
    any JSON value, by another field's value, removed, or an item repeated."""
    kind = draw(st.sampled_from(kinds))
    doc = copy.deepcopy(documents()[kind])
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p[: len(under)] == under and len(p) > len(under)]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        how = draw(st.sampled_from(["replace", "swap", "remove", "repeat"]))
        if how == "replace":
            parent[path[-1]] = draw(JSON_VALUES)
        elif how == "swap":
            other = doc
            for key in draw(st.sampled_from(paths)):
                other = other[key]
            parent[path[-1]] = copy.deepcopy(other)
        elif how == "remove":
            del parent[path[-1]]
        elif isinstance(parent, list):
            parent.insert(path[-1], copy.deepcopy(parent[path[-1]]))
    return kind, doc


def _load_and_use(path: Path, kind: str) -> None:
    try:
        use(memlab_rs.load(path))
    except ValueError:
        pass
    if kind == "trace":
        try:
            use(memlab_rs.trace.load(path, exclude=[]))
        except ValueError:
            pass


@FUZZ
@given(damaged=damaged_documents())
def test_a_damaged_field_of_any_kind_is_a_value_error(damaged):
    kind, doc = damaged
    path = FUZZ_DIR / "field.json"
    path.write_text(json.dumps(doc))
    _load_and_use(path, kind)


@FUZZ
@given(damaged=damaged_documents(kinds=("trace",), under=("data", "snapshot")))
def test_a_damaged_trace_snapshot_is_a_value_error(damaged):
    """The snapshot of a trace result is read by the dict reader (src/trace/load.rs), which
    takes torch's schema loosely: whatever shape a field has, it reads it or says why not
    in a ValueError (never a panic, an OverflowError or an AttributeError)."""
    _kind, doc = damaged
    path = FUZZ_DIR / "snapshot.json"
    path.write_text(json.dumps(doc))
    _load_and_use(path, "trace")
    # The same snapshot handed over as a dict, and saved as torch's JSON.
    from memlab_rs.trace.saved import decode

    try:
        snapshot = decode(doc["data"])
    except ValueError:
        return
    try:
        use(memlab_rs.trace.load(snapshot))
    except ValueError:
        pass
    path.write_text(json.dumps(snapshot))
    try:
        use(memlab_rs.trace.load(path))
    except ValueError:
        pass


@FUZZ
@given(snapshot=JSON_VALUES)
def test_any_json_as_a_snapshot_is_read_or_a_value_error(snapshot):
    doc = copy.deepcopy(documents()["trace"])
    doc["data"]["snapshot"] = snapshot
    path = FUZZ_DIR / "any-snapshot.json"
    path.write_text(json.dumps(doc))
    _load_and_use(path, "trace")
    path.write_text(json.dumps({"segments": snapshot, "device_traces": [[snapshot]]}))
    _load_and_use(path, "trace")


def _mutated_bytes(draw, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(out)))
        how = draw(st.sampled_from(["flip", "cut", "insert", "delete", "repeat"]))
        if how == "flip" and at < len(out):
            out[at] = draw(st.integers(0, 255))
        elif how == "cut":
            del out[at:]
        elif how == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=12))
        elif how == "delete":
            del out[at : at + draw(st.integers(1, 64))]
        elif how == "repeat":
            out[at:at] = out[at : at + draw(st.integers(1, 256))] * draw(st.integers(1, 8))
    return bytes(out)


@st.composite
def damaged_files(draw) -> tuple[str, str, bytes]:
    """(kind, ".json" or ".json.gz", a saved file's bytes mutated at one to four places)."""
    kind = draw(st.sampled_from(KINDS))
    suffix = draw(st.sampled_from([".json", ".json.gz"]))
    text = results.dumps(samples()[kind]).encode("utf-8")
    if suffix == ".json.gz":
        text = gzip.compress(text)
    return kind, suffix, _mutated_bytes(draw, text)


@FUZZ
@given(damaged=damaged_files())
def test_a_damaged_file_of_any_kind_is_a_value_error(damaged):
    kind, suffix, data = damaged
    path = FUZZ_DIR / f"bytes{suffix}"
    path.write_bytes(data)
    _load_and_use(path, kind)


def _commands(damaged: str, good: str, rank1: str) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = [("show", damaged)]
    found += [("show", damaged, "--format", f) for f in ("text", "html", "json", "csv")]
    found += [("diff", good, damaged), ("diff", damaged, damaged)]
    found += [("diff", good, damaged, "--format", f) for f in ("json", "csv")]
    found += [("diff", good, damaged, "--fail-over", "1K", "--columns", "all")]
    found += [("merge", damaged, rank1, "--format", f) for f in ("text", "html", "json", "csv")]
    found += [("merge", rank1, damaged, "-o", str(FUZZ_DIR / "merged.json"))]
    return found


@FUZZ
@given(damaged=damaged_documents() | damaged_files().map(lambda f: (f[0], f)), data=st.data())
def test_the_cli_says_one_line_for_any_damaged_file(damaged, data):
    """show, diff and merge in every format: status 0, 1 (diff --fail-over) or 2 with one
    line on stderr, for a damaged file beside good ones of its kind."""
    kind, content = damaged
    if isinstance(content, tuple):
        path = FUZZ_DIR / f"cli{content[1]}"
        path.write_bytes(content[2])
    else:
        path = FUZZ_DIR / "cli.json"
        path.write_text(json.dumps(content))
    good = FUZZ_DIR / f"good-{kind}.json"
    rank1 = FUZZ_DIR / f"rank1-{kind}.json"
    if not good.exists():
        samples()[kind].save(good)
        other = second_rank(kind) if kind in ("line_profile", "tensor_report") else samples()[kind]
        other.save(rank1)
    args = data.draw(st.sampled_from(_commands(str(path), str(good), str(rank1))))
    status, err = _run_cli(*args)
    if args[0] == "diff" and status == 1:
        assert err.startswith("memlab-rs diff: ") and err.count("\n") == 1, err
        return
    _refused_in_one_line(status, err, args)
