"""Snapshots the trace's tests share: the histories captured on an H100
(tests/fixtures/trace/, written by capture.py) with the start layout our Tracer adds, CPU
histories generated with what a plain model says of them, and a CPU recording built by hand
in the form memlab_rs's CPU recorder returns."""

from __future__ import annotations

import pickle
import random

from paths import FIXTURES

MiB = 1 << 20


def fixture(name):
    with open(FIXTURES / "trace" / f"{name}.pickle", "rb") as f:
        data = pickle.load(f)
    return data["snapshot"], data["facts"]


def as_recorded(snapshot, facts):
    """The snapshot with the start layout our Tracer keeps (what it saves)."""
    ours = dict(snapshot)
    first = snapshot["device_traces"][0][0]["time_us"]
    ours["memlab_rs"] = {
        "version": 1,
        "source": "cuda",
        "start": {"time_us": first, "segments": facts["start_segments"]},
    }
    return ours


def generated(seed, n=400):
    """A CPU history of random allocations and frees, and what a plain model says of it."""
    rng = random.Random(seed)
    frames = [{"filename": f"/app/model{i}.py", "line": 10 + i, "name": f"f{i}"} for i in range(5)]
    start_live = {
        0x1000 * (i + 1): rng.choice([64, 4096, 1 << 20]) for i in range(rng.randint(0, 4))
    }
    live = dict(start_live)
    where = {addr: "untraced" for addr in live}
    entries, next_addr, t = [], 0x100000, 1_000_000
    current = sum(live.values())
    best, best_live = current, dict(live)
    for _ in range(n):
        t += rng.randint(1, 5)
        if live and rng.random() < 0.45:
            addr = rng.choice(sorted(live))
            size = live.pop(addr)
            for action in ("free_requested", "free_completed"):
                entries.append(
                    {
                        "action": action,
                        "addr": addr,
                        "size": size,
                        "stream": 0,
                        "time_us": t,
                        "frames": [],
                        "user_metadata": "",
                    }
                )
            current -= size
        else:
            size = rng.choice([12, 512, 4099, 65536, 1 << 20, 3 << 20])
            frame = rng.choice(frames)
            addr, next_addr = next_addr, next_addr + size + 64
            live[addr] = size
            where[addr] = f"{frame['filename']}:{frame['line']} ({frame['name']})"
            entries.append(
                {
                    "action": "alloc",
                    "addr": addr,
                    "size": size,
                    "stream": 0,
                    "time_us": t,
                    "frames": [frame],
                    "user_metadata": "",
                }
            )
            current += size
            if current > best:
                best, best_live = current, dict(live)
    segments = [
        {
            "device": 0,
            "address": a,
            "total_size": s,
            "stream": 0,
            "segment_type": "cpu",
            "blocks": [
                {
                    "address": a,
                    "size": s,
                    "requested_size": s,
                    "state": "active_allocated",
                    "frames": [],
                }
            ],
        }
        for a, s in sorted(live.items())
    ]
    snapshot = {
        "segments": segments,
        "device_traces": [entries],
        "memlab_rs": {
            "version": 1,
            "source": "cpu",
            "start": {"time_us": 1_000_000, "live": [[a, s] for a, s in start_live.items()]},
        },
    }
    expected = {}
    for addr, size in best_live.items():
        expected.setdefault(where[addr], []).append(size)
    return snapshot, best, expected


def frame(filename, line, name):
    return {"filename": filename, "line": line, "name": name}


def cpu_recording():
    """A CPU recording as _core._cpu_trace_stop returns it (TRACE_CONTRACT.md): one segment
    per live allocation, segment_type "cpu", device 0, and the "memlab_rs" key."""
    here = frame("/home/u/model.py", 12, "forward")
    live = [(0x5500_0000_1000, 4096), (0x5500_0010_0000, 3 * MiB)]
    segments = [
        {
            "device": 0,
            "address": a,
            "total_size": n,
            "allocated_size": n,
            "active_size": n,
            "requested_size": n,
            "stream": 0,
            "segment_type": "cpu",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": [],
            "blocks": [
                {
                    "address": a,
                    "size": n,
                    "requested_size": n,
                    "state": "active_allocated",
                    "frames": [here] if n == 3 * MiB else [],
                }
            ],
        }
        for a, n in live
    ]
    t0 = 1_700_000_000_000_000
    temp = 0x5500_0100_0000

    def entry(action, addr, size, t, frames):
        return {
            "action": action,
            "addr": addr,
            "size": size,
            "stream": 0,
            "time_us": t0 + t,
            "frames": frames,
            "user_metadata": "",
        }

    trace = [
        entry("alloc", live[1][0], 3 * MiB, 10, [here]),
        entry("alloc", temp, MiB, 20, [here]),
        entry("free_requested", temp, MiB, 30, []),
        entry("free_completed", temp, MiB, 30, []),
    ]
    return {
        "segments": segments,
        "device_traces": [trace],
        "allocator_settings": {},
        "external_annotations": [],
        "memlab_rs": {
            "version": 1,
            "source": "cpu",
            "start": {"time_us": t0, "live": [[live[0][0], 4096]]},
            "dropped": 0,
            "no_stack": 0,
        },
    }
