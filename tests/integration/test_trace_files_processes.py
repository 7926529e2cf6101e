"""The trace's files across processes: what needs another program or a fresh interpreter.

- torch's own command line tools (``python -m torch.cuda._memory_viz``) read the pickle
  ``export_memory_viz`` writes;
- the streaming pickle reader's memory on a 32 MB snapshot, measured in fresh processes
  against ``pickle.load`` and the dict reader.

Neither depends on the interpreter, so this file runs once (noxfile.py); the in-process
counterparts are tests/unit/trace/ (test_memory_viz_export.py, test_trace_stream.py).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
from trace_snapshots import cpu_recording, fixture

from memlab_rs.trace.memory_viz import export_memory_viz

# --- torch's tools read what export_memory_viz writes ------------------------------------------


def test_torch_command_line_tools_read_the_pickle(tmp_path):
    path = export_memory_viz(cpu_recording(), tmp_path / "cpu.pickle")
    for action, expected in (("stats", "total_allocated: 3.0MiB"), ("trace", "4 entries")):
        done = subprocess.run(
            [sys.executable, "-m", "torch.cuda._memory_viz", action, str(path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert expected in done.stdout


# --- the streaming reader's memory, in fresh processes --------------------------------------


def write(path, snapshot, protocol):
    with open(path, "wb") as f:
        pickle.dump(snapshot, f, protocol=protocol)
    return path


MEASURE = textwrap.dedent(
    """
    import json, pickle, sys, time
    import memlab_rs.trace as trace

    def hwm():  # this process's peak RSS (ru_maxrss would keep the parent's across exec)
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))

    how, path = sys.argv[1], sys.argv[2]
    base = hwm()
    began = time.perf_counter()
    if how == "stream":
        result = trace.load(path)
    else:
        with open(path, "rb") as f:
            result = trace.load(pickle.load(f))
    text = result.text()
    seconds = time.perf_counter() - began
    peak = hwm()
    print(json.dumps({"base": base, "peak": peak, "seconds": seconds, "text": text}))
    """
)


def big_snapshot(path, target_bytes):
    """The gpt2 fixture's history repeated with shifted addresses and times until the pickle
    is about `target_bytes`; frame dicts shared, frame lists per copy (as torch writes)."""
    snapshot, _ = fixture("gpt2_tiny")
    entries0 = snapshot["device_traces"][0]
    one = len(pickle.dumps(snapshot, protocol=4))
    copies = max(1, target_bytes // one)
    period = entries0[-1]["time_us"] - entries0[0]["time_us"] + 1000
    entries, segments = [], []
    for k in range(copies):
        lists = {}

        def shifted(item, key, k=k, lists=lists):
            out = dict(item)
            if key in out and out.get("action") not in ("snapshot", "oom"):
                out[key] += k << 36
            if "time_us" in out:
                out["time_us"] += k * period
            if "frames" in out:
                out["frames"] = lists.setdefault(id(item["frames"]), list(item["frames"]))
            return out

        entries.extend(shifted(e, "addr") for e in entries0)
        for seg in snapshot["segments"]:
            copy = shifted(seg, "address")
            copy["blocks"] = [shifted(b, "address") for b in seg["blocks"]]
            segments.append(copy)
    write(path, dict(snapshot, segments=segments, device_traces=[entries]), 4)
    return copies, len(entries)


# Big enough that the pickle's dict dwarfs the fixed costs (the imports are measured out),
# small enough to build and load in seconds on every Python CI runs.
SIZE = 32 << 20


def measure(how, path):
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, how, str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM (Linux)")
def test_a_32mb_snapshot_streams_in_a_fraction_of_pickle_loads_memory(tmp_path):
    path = tmp_path / "big.pickle"
    copies, entries = big_snapshot(path, SIZE)
    size = os.path.getsize(path)
    stream = measure("stream", path)
    dict_path = measure("pickle", path)
    assert stream["text"] == dict_path["text"]
    mib = 1 << 20
    grew = {
        k: (v["peak"] - v["base"]) / mib for k, v in (("stream", stream), ("pickle", dict_path))
    }
    print(
        f"\n{size / mib:.0f} MiB pickle ({copies} copies, {entries:,} entries): "
        f"peak RSS above the imports: stream {grew['stream']:.0f} MiB in "
        f"{stream['seconds']:.2f} s, pickle.load + dict {grew['pickle']:.0f} MiB in "
        f"{dict_path['seconds']:.2f} s"
    )
    # Measured: 30 MiB, 341k entries: stream +32 MiB, pickle.load + dict +176 MiB (at 93 MiB
    # it was +97 against +552: the ratio holds as the file grows).
    assert grew["stream"] * 3 < grew["pickle"]
