"""Interpreter exit while CPU memory is tracked and threads are still running.

Run by tests/unit/sources/test_cpu_allocator_robust.py as
``python cpu_exit_children.py RUNS OUT_DIR``.
It imports torch once, then forks RUNS children (two at a time). Each child starts the
scenario below and ends through a normal interpreter exit (half of them by ``sys.exit`` from
inside a profiled function, half by falling off the end of this script):
``threading._shutdown`` waits for the non-daemon threads, atexit handlers run, daemon
threads are frozen, modules are torn down and C++ static destructors run, all while a CPU
LineProfiler is enabled and ``_core._cpu_start()`` was never undone, so libc10's GOT slots
still point at our hook.

The scenario:
- a CPU ``LineProfiler`` enabled, and ``_core._cpu_start()`` without a stop;
- CPU tensors alive before tracking starts (adopted at enable; freed at teardown);
- two non-daemon threads inside a profiled function that allocates and frees until the
  main thread is gone and 50 times after, while the interpreter waits for them;
- two daemon threads looping inside a profiled function that allocates and frees. At exit
  they are parked at a lock between two torch calls by an atexit handler: torch itself
  aborts the process ("terminate called without an active exception") when a daemon thread
  is inside a torch operator that released the GIL as the interpreter finalises, with or
  without memlab_rs, so they must be outside torch, but they stay alive, inside profiled
  frames, holding tensors.

The atexit handler also checks the counters against the truth: the hook is still installed
and the live bytes equal the bytes of every CPU storage Python can reach. It writes
``checked N live bytes`` to stderr, or what failed. The parent requires each child's stderr
to be exactly that line (no failed check, no traceback, no "Exception ignored" at teardown)
and its exit status to be 0; it prints ``codes {status: count}``, the first few unexpected
stderr texts, and ``noisy COUNT``.
"""

from __future__ import annotations

import atexit
import gc
import os
import re
import sys
import threading

import torch

from memlab_rs import LineProfiler, _core

SIZES = (4096, 12288)  # bytes, as uint8 tensors


def live_cpu_storage_bytes() -> int:
    """Bytes of every distinct CPU storage reachable through a tensor Python tracks."""
    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        # type(), not isinstance(): no __class__ lookup on lazy modules (which warns).
        if issubclass(type(obj), torch.Tensor) and obj.device.type == "cpu":
            storage = obj.untyped_storage()
            if storage.nbytes():
                seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def churn_past_exit(rounds: int, started: threading.Event) -> None:
    """Profiled: allocate and free until the main thread has gone (``threading._shutdown``
    marks it stopped before it waits for this thread), then ``rounds`` more times."""
    main = threading.main_thread()
    i = 0
    while main.is_alive() or i < rounds:
        if not main.is_alive():
            i += 1
        t = torch.empty(SIZES[i % 2], dtype=torch.uint8)
        held = t + 1
        del t, held
        started.set()


GATE = threading.Lock()


def endless_churn(started: threading.Event) -> None:
    """Profiled: allocate and free for ever, under GATE, always holding the newest tensor."""
    held = []
    while True:
        with GATE:
            held.append(torch.empty(SIZES[0], dtype=torch.uint8))
            del held[0:-1]
            started.set()


def check_at_exit() -> None:
    """Runs after the non-daemon threads ended: park the daemon threads, check the counts."""
    GATE.acquire()  # never released: daemon threads stay parked outside torch
    problems = []
    if _core._cpu_mode() != "allocator":
        problems.append(f"mode at exit is {_core._cpu_mode()!r}")
    if not all(ours for _, _, ours in _core._cpu_hook_slots()):
        problems.append(f"a slot lost our hook: {_core._cpu_hook_slots()}")
    stats = dict(_core._cpu_stats())
    live = live_cpu_storage_bytes()
    if stats["allocated_bytes.all.current"] != live:
        problems.append(f"counted {stats['allocated_bytes.all.current']} live bytes, found {live}")
    sys.stderr.write("\n".join(problems) if problems else f"checked {live} live bytes")
    sys.stderr.write("\n")


def scenario(index: int) -> None:
    global kept_before, profiler
    kept_before = [torch.ones(1000 + i) for i in range(4)]  # adopted at enable
    profiler = LineProfiler(churn_past_exit, endless_churn, exit_from_profiled_code, device="cpu")
    profiler.enable()
    _core._cpu_start()
    atexit.register(check_at_exit)
    started = [threading.Event() for _ in range(4)]
    for event in started[:2]:
        threading.Thread(target=endless_churn, args=(event,), daemon=True).start()
    for event in started[2:]:
        threading.Thread(target=churn_past_exit, args=(50, event)).start()
    for event in started:
        event.wait()
    if index % 2:
        exit_from_profiled_code()
    # else: fall off the end of the script


def exit_from_profiled_code() -> None:
    """Profiled: the main thread leaves through SystemExit from inside profiled code."""
    t = torch.empty(SIZES[1], dtype=torch.uint8)
    sys.exit(0)
    del t


def spawn(runs: int, out_dir: str) -> int | None:
    """Fork the children; returns the child's index in a child, None in the parent."""
    running: dict[int, int] = {}
    codes: dict[int, int] = {}
    noisy: list[str] = []
    started = 0
    while started < runs or running:
        while started < runs and len(running) < 2:
            path = os.path.join(out_dir, f"stderr-{started}.txt")
            pid = os.fork()
            if pid == 0:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(fd, 2)
                os.close(fd)
                return started
            running[pid] = started
            started += 1
        pid, status = os.wait()
        index = running.pop(pid)
        codes[status] = codes.get(status, 0) + 1
        with open(os.path.join(out_dir, f"stderr-{index}.txt")) as f:
            text = f.read()
        if not re.fullmatch(r"checked [1-9][0-9]* live bytes\n", text):
            noisy.append(f"child {index}: {text!r}")
    print("codes", codes)
    for line in noisy[:5]:
        print("stderr", line)
    print("noisy", len(noisy))
    return None


gc.freeze()  # the children inherit the heap: no collection walks it again (copy-on-write)
child = spawn(int(sys.argv[1]), sys.argv[2])
if child is not None:
    scenario(child)
