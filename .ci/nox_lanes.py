"""Run noxfile.py's pytest sessions (one per CPython 3.9-3.13) in parallel lanes when the
machine has the cores and the memory for it; `make test` calls this.

Why: the suite runs once per Python, and CI has a time limit. Each session is mostly one
pytest process (plus the subprocesses its tests start) that keeps about 1.1 cores busy, so
two sessions side by side use a 2-core machine better: on this project's 2-core machine
five sessions took 39.5 min in two lanes, against an estimated 47 one after another (from
each session's time alone).
Lanes = cores (at most 5), fewer if the available memory is below 6 GB a lane (NOX_LANES=N
sets it by hand); the newest and the oldest Python, whose sessions also run tests/contract
and tests/integration (noxfile.py) and take about three times as long as the others, start
first, side by side, so that no long one is left alone at the end. One lane is plain `nox`,
its output streamed as it runs.
With several lanes each session's output is printed whole when it ends, so logs never
interleave, and the exit status is non-zero if any session failed.

Arguments are passed to nox unchanged (then everything runs in one lane, as asked):

    python .ci/nox_lanes.py                      # every Python, in lanes
    python .ci/nox_lanes.py -p 3.12 -- -x        # plain nox
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOX = [str(Path(sys.executable).parent / "nox")]
PYTHONS = ["3.9", "3.10", "3.11", "3.12", "3.13"]
GB = 1 << 30


def available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def lanes() -> int:
    if os.environ.get("NOX_LANES", "").isdigit():  # set by hand: as many lanes as asked
        return max(1, int(os.environ["NOX_LANES"]))
    by_cores = os.cpu_count() or 1
    by_memory = available_memory() // (6 * GB)
    return max(1, min(len(PYTHONS), by_cores, by_memory))


def main(argv: list[str]) -> int:
    count = lanes()
    if argv or count == 1:
        return subprocess.call(NOX + argv, cwd=ROOT)
    print(f"nox_lanes: {count} lanes for {len(PYTHONS)} sessions", flush=True)
    # The slowest first: the newest and the oldest (they run the integration tests too).
    queue = [PYTHONS[-1], PYTHONS[0], *reversed(PYTHONS[1:-1])]
    failed: list[str] = []
    lock = threading.Lock()
    # One core's worth of torch threads per lane: torch starts as many intra-op threads as
    # the machine has cores in every interpreter, so lanes side by side would run twice as
    # many busy threads as cores, and OpenMP threads that spin while waiting for each other
    # lose their time slices. A value the caller set stands.
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // count)))

    def lane() -> None:
        while True:
            with lock:
                if not queue:
                    return
                version = queue.pop(0)
            started = time.monotonic()
            with tempfile.TemporaryFile("w+") as log:
                proc = subprocess.Popen(
                    NOX + ["-s", f"tests-{version}"],
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
                # wait4: this session's CPU time (nox, pytest and every process they waited
                # for), which on a shared 2-core machine says more than its wall time.
                _, status, usage = os.wait4(proc.pid, 0)
                proc.returncode = code = os.waitstatus_to_exitcode(status)
                cpu = usage.ru_utime + usage.ru_stime
                log.seek(0)
                with lock:
                    minutes = (time.monotonic() - started) / 60
                    print(
                        f"\n===== tests-{version}: exit {code}, {minutes:.1f} min, "
                        f"{cpu:.0f} CPU-s ====="
                    )
                    sys.stdout.write(log.read())
                    sys.stdout.flush()
                    if code != 0:
                        failed.append(version)

    threads = [threading.Thread(target=lane) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        print(f"nox_lanes: failed: {', '.join('tests-' + v for v in failed)}")
        return 1
    print("nox_lanes: every session passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
