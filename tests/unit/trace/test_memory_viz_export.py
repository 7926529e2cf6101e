"""export_memory_viz: files that pytorch.org/memory_viz and torch's own tools read.

The snapshots are built by hand in torch's schema with known allocations (a CUDA-like one
with two segments, and a CPU recording in the form memlab_rs's CPU tracer returns), written
in both formats, re-loaded, and analysed with torch.cuda._memory_viz: segsum, trace, and the
memory/segments flamegraph inputs (the flamegraph step itself needs Perl and a download, so
its input lines are checked instead). torch's command line tools reading the pickle are
tests/integration/test_trace_files_processes.py's.
"""

from __future__ import annotations

import json
import os
import pickle
import pickletools

import numpy as np
import pytest
from torch.cuda import _memory_viz as mv
from trace_snapshots import cpu_recording

from memlab_rs.trace.memory_viz import export_memory_viz

KiB, MiB = 1 << 10, 1 << 20
SEG_A, SEG_B = 0x7F0000000000, 0x7F0000400000

# The opcodes the viewer's unpickler handles (function `unpickle` in
# torch/utils/viz/MemoryViz.js); anything else makes it throw "UNKNOWN OPCODE".
VIEWER_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET",
    "LONG_BINGET", "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST",
    "APPEND", "APPENDS", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE",
    "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT",
    "SHORT_BINUNICODE", "BINUNICODE",
}  # fmt: skip


def frame(filename, line, name):
    return {"filename": filename, "line": line, "name": name}


def cuda_like_snapshot():
    """Two segments on device 0: A (2 MiB) holds 1 MiB (1,000,000 requested) and 512 KiB
    allocated and 512 KiB free; B (20 MiB) one 20 MiB block. The trace allocates all of it
    and frees a third 512 KiB block of A (the free one)."""
    fwd = frame("/home/u/model.py", 42, "forward")  # shared, as torch shares frames
    step = frame("/home/u/train.py", 7, "step")
    stack = [fwd, step]

    def block(address, size, requested, state, frames):
        return {
            "address": address,
            "size": size,
            "requested_size": requested,
            "state": state,
            "frames": frames,
        }

    def segment(address, total, blocks):
        allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        return {
            "device": 0,
            "address": address,
            "total_size": total,
            "allocated_size": allocated,
            "active_size": allocated,
            "requested_size": sum(
                b["requested_size"] for b in blocks if b["state"] == "active_allocated"
            ),
            "stream": 0,
            "segment_type": "large",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": [],
            "blocks": blocks,
        }

    def entry(action, addr, size, t):
        return {
            "action": action,
            "addr": addr,
            "size": size,
            "stream": 0,
            "time_us": 1_700_000_000_000_000 + t,
            "frames": stack,
            "user_metadata": "forward:layer1" if action == "alloc" else "",
        }

    return {
        "segments": [
            segment(
                SEG_A,
                2 * MiB,
                [
                    block(SEG_A, MiB, 1_000_000, "active_allocated", stack),
                    block(SEG_A + MiB, 512 * KiB, 512 * KiB, "active_allocated", stack),
                    block(SEG_A + 1536 * KiB, 512 * KiB, 0, "inactive", []),
                ],
            ),
            segment(SEG_B, 20 * MiB, [block(SEG_B, 20 * MiB, 20 * MiB, "active_allocated", stack)]),
        ],
        "device_traces": [
            [
                entry("segment_alloc", SEG_A, 2 * MiB, 0),
                entry("alloc", SEG_A, MiB, 1),
                entry("alloc", SEG_A + MiB, 512 * KiB, 2),
                entry("alloc", SEG_A + 1536 * KiB, 512 * KiB, 3),
                entry("free_requested", SEG_A + 1536 * KiB, 512 * KiB, 4),
                entry("free_completed", SEG_A + 1536 * KiB, 512 * KiB, 5),
                entry("segment_alloc", SEG_B, 20 * MiB, 6),
                entry("alloc", SEG_B, 20 * MiB, 7),
            ]
        ],
        "allocator_settings": {},
        "external_annotations": [],
    }


def as_json(value):
    """What a JSON round trip makes of a value: tuples become lists."""
    return json.loads(json.dumps(value))


def reload(path, fmt):
    if fmt == "pickle":
        with open(path, "rb") as f:
            return pickle.load(f)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def no_flamegraph(lines):
    return lines


def flame_bytes(lines):
    """bytes per (state, frames) of memory()/segments() flamegraph input lines."""
    out = {}
    for line in lines.strip().splitlines():
        stack, n = line.rsplit(" ", 1)
        key = ";".join(stack.split(";")[1:]) if stack.startswith("stream_") else stack
        out[key] = out.get(key, 0) + int(n)
    return out


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_a_cuda_snapshot_round_trips_and_torch_analyses_it(tmp_path, fmt):
    snap = cuda_like_snapshot()
    path = export_memory_viz(snap, tmp_path / f"snap.{fmt}", format=fmt)
    loaded = reload(path, fmt)
    assert loaded == (snap if fmt == "pickle" else as_json(snap))

    summary = mv.segsum(loaded)
    assert "segments: 2\n" in summary
    assert "total_reserved: 22.0MiB\n" in summary
    # requested bytes of the active blocks; A's rounding (48576 bytes) is internal free
    allocated = 1_000_000 + 512 * KiB + 20 * MiB
    assert f"total_allocated: {mv.Bytes(allocated)}\n" in summary
    assert f"total_free: {mv.Bytes(512 * KiB + 48_576)} (8.5% internal)\n" in summary
    assert "[a] 20.0MiB allocated, 0.0B free\n" in summary  # B: one 20 MiB page, full

    trace = mv.trace(loaded)
    assert trace.startswith("Device 0 ----------------\n8 entries\n")
    assert f"a = cudaMalloc({SEG_A}, 2.0MiB)\n" in trace
    assert "b = a[0:1.0MiB]\n" in trace
    assert "c = a[1048576:512.0KiB]\n" in trace
    assert "d = a[1572864:512.0KiB]\ndel d # 512.0KiB\n# free completed for d 512.0KiB\n" in trace
    assert f"e = cudaMalloc({SEG_B}, 20.0MiB)\nf = e[0:20.0MiB]\n" in trace

    memory = flame_bytes(mv.memory(loaded, format_flamegraph=no_flamegraph))
    stack = "train.py:7:step;model.py:42:forward"
    assert memory == {
        f"active_allocated;{stack}": 1_000_000 + 512 * KiB + 20 * MiB,
        "active_allocated;<gaps>": 48_576,
        "inactive;<non-python>": 0,
        "inactive;<gaps>": 512 * KiB,
    }
    segments = mv.segments(loaded, format_flamegraph=no_flamegraph)
    assert f"stream_0;seg_{SEG_B};active_allocated;{stack} {20 * MiB}\n" in segments


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_a_cpu_recording_is_accepted_with_our_extra_key(tmp_path, fmt):
    snap = cpu_recording()
    path = export_memory_viz(snap, tmp_path / f"cpu.{fmt}", format=fmt)
    loaded = reload(path, fmt)
    assert loaded["memlab_rs"]["source"] == "cpu"  # kept: no tool of torch's minds it
    assert loaded == (snap if fmt == "pickle" else as_json(snap))
    assert "total_allocated: 3.0MiB\n" in mv.segsum(loaded)
    assert f"total_reserved: {mv.Bytes(3 * MiB + 4096)}\n" in mv.segsum(loaded)
    trace = mv.trace(loaded)
    assert "4 entries\n" in trace
    assert "a = seg_1[0:3.0MiB]\n" in trace  # the traced allocation, inside its segment
    assert f"b = MEM[{0x5500_0100_0000}:1.0MiB]\n" in trace  # the temporary, freed since
    assert "# free completed for b 1.0MiB\n" in trace
    memory = flame_bytes(mv.memory(loaded, format_flamegraph=no_flamegraph))
    assert memory == {
        "active_allocated;model.py:12:forward": 3 * MiB,
        "active_allocated;<non-python>": 4096,
    }


def test_the_pickle_is_protocol_4_with_only_opcodes_the_viewer_reads(tmp_path):
    snap = cuda_like_snapshot()
    snap["allocator_settings"] = {"expandable_segments": False, "garbage_collection": 0.5}
    snap["device_traces"][0][0]["frames"] = [frame("/x/" + "long" * 80 + ".py", 1, "f")]
    snap["device_traces"][0][1]["size"] = -3  # negative ints pickle as BININT
    snap["segments"][0]["blocks"][0]["frames"] = [frame("ö.py", 70000, "g")]  # BININT, UTF-8
    path = export_memory_viz(snap, tmp_path / "s.pickle")
    data = path.read_bytes()
    assert data[:2] == b"\x80\x04"
    used = {op.name for op, _, _ in pickletools.genops(data)}
    assert used <= VIEWER_OPCODES, used - VIEWER_OPCODES
    # frames shared between entries are written once and referenced (memo), as torch's are
    assert data.count(b"/home/u/model.py") == 1


def test_the_json_is_compact_and_strict(tmp_path):
    path = export_memory_viz(cpu_recording(), tmp_path / "cpu.json", format="json")
    text = path.read_text(encoding="utf-8")
    assert text.startswith('{"segments":[{"device":0,')
    assert '"segment_pool_id":[0,0]' in text
    snap = cpu_recording()
    snap["memlab_rs"]["rate"] = float("nan")
    with pytest.raises(ValueError, match=r"snapshot\['memlab_rs'\]\['rate'\] is nan"):
        export_memory_viz(snap, tmp_path / "nan.json", format="json")
    assert not (tmp_path / "nan.json").exists()
    export_memory_viz(snap, tmp_path / "nan.pickle")  # a pickle holds NaN fine


def test_bad_input_is_named_with_the_fix(tmp_path):
    target = tmp_path / "x.pickle"
    with pytest.raises(ValueError, match='format must be "pickle" or "json"'):
        export_memory_viz(cpu_recording(), target, format="xml")
    with pytest.raises(TypeError, match="expected a snapshot dict"):
        export_memory_viz([], target)
    with pytest.raises(ValueError, match="has no list 'device_traces'"):
        export_memory_viz({"segments": []}, target)
    snap = cpu_recording()
    snap["segments"][1]["blocks"][0]["size"] = np.int64(3 * MiB)
    with pytest.raises(ValueError, match=r"\['blocks'\]\[0\]\['size'\] is not an int"):
        export_memory_viz(snap, target)
    snap = cpu_recording()
    snap["device_traces"][0][0]["size"] = np.int64(3 * MiB)
    with pytest.raises(TypeError, match=r"\['device_traces'\]\[0\]\[0\]\['size'\] is a numpy"):
        export_memory_viz(snap, target)
    snap = cpu_recording()
    snap["memlab_rs"][1] = "x"
    with pytest.raises(TypeError, match="has the key 1; memory_viz reads str keys only"):
        export_memory_viz(snap, target)
    snap = cuda_like_snapshot()
    del snap["segments"][0]["blocks"][2]  # the free block: the rest no longer fills A
    with pytest.raises(ValueError, match=r"add up to 1572864 bytes, not its total_size 2097152"):
        export_memory_viz(snap, target)
    snap = cuda_like_snapshot()
    blocks = snap["segments"][0]["blocks"]
    blocks[1], blocks[2] = blocks[2], blocks[1]
    with pytest.raises(ValueError, match="in address order"):
        export_memory_viz(snap, target)
    assert os.listdir(tmp_path) == []  # nothing half-written


def test_an_existing_file_is_replaced_whole(tmp_path):
    target = tmp_path / "snap.pickle"
    target.write_bytes(b"old")
    export_memory_viz(cpu_recording(), target)
    assert reload(target, "pickle")["memlab_rs"]["version"] == 1
    assert sorted(os.listdir(tmp_path)) == ["snap.pickle"]
