"""The streaming pickle reader (`trace.load(path)`) against the dict reader (`trace.load(dict)`):
the same report from the GPU fixtures and generated histories at pickle protocols 2, 4 and 5,
clear errors for bad files, the fallback for protocols 0 and 1. Its memory on a 32 MB snapshot,
measured in fresh processes, is tests/integration/test_trace_files_processes.py's."""

import pickle

import pytest
from trace_snapshots import as_recorded, fixture, generated

import memlab_rs.trace as trace
from memlab_rs import _core


def same_report(a, b):
    assert a.text() == b.text()
    assert a.module_text() == b.module_text()
    assert a.to_json() == b.to_json()
    assert a.devices == b.devices
    assert a.source == b.source
    for device in a.devices:
        assert a.summary(device) == b.summary(device)
        assert a.rows(device) == b.rows(device)
        assert a.module_rows(device) == b.module_rows(device)
        assert a.notices(device) == b.notices(device)
        assert a.timeline(device) == b.timeline(device)
        assert a.line_peak_live(device) == b.line_peak_live(device)


def write(path, snapshot, protocol):
    with open(path, "wb") as f:
        pickle.dump(snapshot, f, protocol=protocol)
    return path


@pytest.mark.parametrize("protocol", [2, 4, 5])
@pytest.mark.parametrize("name", ["mlp_adam", "gpt2_tiny"])
@pytest.mark.parametrize("recorded", [False, True])
def test_fixtures_stream_to_the_same_report(tmp_path, name, protocol, recorded):
    snapshot, facts = fixture(name)
    if recorded:
        snapshot = as_recorded(snapshot, facts)
    path = write(tmp_path / "s.pickle", snapshot, protocol)
    # The reader itself, not a fallback: it must accept these protocols.
    _core.trace.TraceAnalysis.from_pickle(str(path), '{"exclude": []}')
    streamed = trace.load(path)
    assert streamed._snapshot is None  # the dict was never built
    same_report(streamed, trace.load(snapshot))
    assert streamed.max_mem(0) == trace.load(snapshot).max_mem(0)


@pytest.mark.parametrize("seed", range(40))
def test_generated_histories_stream_to_the_same_report(tmp_path, seed):
    snapshot, best, _ = generated(seed)
    path = write(tmp_path / "g.pickle", snapshot, 4 if seed % 2 else 2)
    streamed = trace.load(path)
    assert streamed._snapshot is None
    assert streamed.max_mem("cpu") == best
    same_report(streamed, trace.load(snapshot))


def test_shared_frame_lists_and_recursive_frames(tmp_path):
    """A free entry sharing its allocation's frames list, a frame twice in one stack, a
    block sharing an entry's list: the memo's references resolve as in the dict."""
    f = {"filename": "/app/a.py", "line": 3, "name": "g"}
    stack = [f, f, {"filename": "/app/b.py", "line": 9, "name": "h"}]
    alloc = {"action": "alloc", "addr": 4096, "size": 100, "stream": 0, "time_us": 5,
             "frames": stack, "user_metadata": "forward:fc"}
    free = dict(alloc, action="free_requested", time_us=6)
    alloc2 = dict(alloc, addr=8192, time_us=7, frames=stack)
    snapshot = {
        "segments": [{"device": 0, "address": 8192, "total_size": 2 << 20,
                      "segment_type": "small", "blocks": [
                          {"address": 8192, "size": 512, "requested_size": 100,
                           "state": "active_allocated", "frames": stack}]}],
        "device_traces": [[alloc, free, dict(free, action="free_completed"), alloc2]],
    }
    path = write(tmp_path / "s.pickle", snapshot, 4)
    streamed = trace.load(path)
    assert streamed._snapshot is None
    same_report(streamed, trace.load(snapshot))
    assert streamed.rows(0)[0].location == "/app/a.py:3 (g)"


def test_bad_files_give_clear_errors(tmp_path):
    snapshot, _ = fixture("mlp_adam")
    good = write(tmp_path / "good.pickle", snapshot, 4).read_bytes()
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match=r"cut.pickle.*not a snapshot pickle.*truncated"):
        trace.load(cut)
    empty = tmp_path / "empty.pickle"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="not a snapshot pickle.*empty"):
        trace.load(empty)
    text = tmp_path / "notes.txt"
    text.write_text("hello, not a pickle\n")
    with pytest.raises(ValueError, match="notes.txt.*not a snapshot pickle"):
        trace.load(text)
    listed = write(tmp_path / "list.pickle", [1, 2, 3], 4)
    with pytest.raises(ValueError, match="not a memory snapshot: it is not a dict"):
        trace.load(listed)
    no_traces = write(tmp_path / "nt.pickle", {"segments": []}, 4)
    with pytest.raises(ValueError, match="not a memory snapshot.*device_traces"):
        trace.load(no_traces)
    with pytest.raises(FileNotFoundError, match="no snapshot file"):
        trace.load(tmp_path / "missing.pickle")


def test_protocols_0_and_1_fall_back_to_the_plain_data_unpickler(tmp_path):
    snapshot, facts = fixture("mlp_adam")
    for protocol in (0, 1):
        path = write(tmp_path / f"p{protocol}.pickle", snapshot, protocol)
        with pytest.raises(NotImplementedError, match="protocols 0 and 1"):
            _core.trace.TraceAnalysis.from_pickle(str(path), '{"exclude": []}')
        assert trace.load(path).text() == trace.load(snapshot).text()
    # A set (EMPTY_SET) somewhere: no snapshot holds one, and nothing reads it.
    odd = dict(snapshot, external_annotations={1, 2})
    path = write(tmp_path / "set.pickle", odd, 4)
    for load in (lambda: _core.trace.TraceAnalysis.from_pickle(str(path), '{"exclude": []}'),
                 lambda: trace.load(path)):
        with pytest.raises(ValueError, match=r"opcode EMPTY_SET \(0x8f\), a set"):
            load()


def test_snapshot_is_loaded_on_demand_and_save_copies(tmp_path):
    snapshot, facts = fixture("mlp_adam")
    path = write(tmp_path / "s.pickle", as_recorded(snapshot, facts), 4)
    result = trace.load(path)
    out = tmp_path / "saved.pickle"
    result.save(out)
    assert result._snapshot is None  # a protocol-4 file is copied, not loaded
    assert out.read_bytes() == path.read_bytes()
    assert result.snapshot["device_traces"] == as_recorded(snapshot, facts)["device_traces"]
    p2 = write(tmp_path / "p2.pickle", snapshot, 2)
    out2 = tmp_path / "saved2.pickle"
    trace.load(p2).save(out2)
    assert out2.read_bytes()[:2] == b"\x80\x04"  # memory_viz's protocol
    assert trace.load(out2).text() == trace.load(snapshot).text()
