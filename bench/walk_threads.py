"""How the gc walk scales with threads, on one process (see bench/reporter_walk.py).

python bench/walk_threads.py
"""

from __future__ import annotations

import os
import subprocess
import sys

CHILD = """
import os, statistics, sys
sys.path.insert(0, "bench")
from reporter_walk import build_process
import memlab_rs
model, optimizer, records = build_process(350_000)
walks = [memlab_rs.MemReporter(model).collect().to_data()["walk"] for _ in range(15)]
# MEMLAB_RS_WALK_THREADS, as set, is the walk's thread limit (src/gc_walk/chains.rs).
print(os.environ["MEMLAB_RS_WALK_THREADS"],
      statistics.median(w["walk_seconds"] for w in walks) * 1e3, walks[0]["strategy"])
"""


def main() -> None:
    print(f"cores available: {len(os.sched_getaffinity(0))}")
    for threads in ("1", "2", "4", "8", "16"):
        env = dict(os.environ, MEMLAB_RS_WALK_THREADS=threads)
        out = subprocess.run(
            [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        print(f"threads {out[0]:>2}: walk median {float(out[1]):6.2f} ms ({out[2].strip()})")


if __name__ == "__main__":
    main()
