"""Measuring on the device what a kernel takes and gives back inside one op, which its fake
kernel cannot show and no rule here predicts: the convolutions' workspaces.

cuDNN picks a convolution engine per shape, layout, dtype and GPU (heuristics, or the
search under ``cudnn.benchmark``) and takes its workspace from the caching allocator for
the call; oneDNN on CPU reorders operands into blocked layouts and takes scratch from
c10's allocator. Neither size is a function of the shapes one could write down: it is the
library's choice on that machine. So each distinct convolution the fake step runs (its
shapes, strides, dtype and arguments) is run for real, once, on the device the estimate is
for, under the allocator's own trace, and the estimate replays that trace in the op's place:
its outputs and its scratch blocks in the order and sizes the kernel made them (the op's
peak exactly, and the blocks as the caching allocator sees them, so the modelled segments
follow too).

The kernels run in a worker process of their own (``_main`` in a new interpreter), never
in the user's:

- the user's peak statistics (``max_memory_allocated``), cuDNN's plan cache and CPU
  allocator stay untouched, and a probe that runs out of memory or crashes costs only
  that probe (the estimate then says which workspaces it could not measure);
- the worker gets the user's settings that choose kernels (cuDNN's enabled, benchmark,
  deterministic and TF32 flags, oneDNN's, the CPU thread count) and runs each op twice:
  the first call is what a step's first call of that kernel does (cuDNN tries engine
  configs, or searches under ``cudnn.benchmark``), the second what later calls do;
- on CUDA the worker holds a CUDA context on the user's GPU while it lives: it lives for
  one estimate, or for one ``plan`` / ``max_batch_size`` (``held_open``), then exits.

Results are cached per process by the op, its arguments and those settings, so a plan's
rows and a search's steps run each distinct kernel once.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch

# The ops whose kernels take workspace their fake kernels cannot show (forward, and the
# backward that computes the input's and the weight's gradients).
PROBED_OPS = frozenset({"aten.convolution.default", "aten.convolution_backward.default"})

_START_TIMEOUT_S = 120.0  # importing torch and making a CUDA context, on a loaded machine
_CALL_TIMEOUT_S = 300.0  # one convolution on CPU at a large batch
_CACHE_LIMIT = 100_000
# What the probe measures, as the notes name it: on CUDA, else on the CPU.
_CUDA_WHAT, _CPU_WHAT = "cuDNN workspaces", "oneDNN scratch"
# Per kernel and settings: its two traces, or why it could not be measured (a failure is
# kept too: a worker that cannot start is not started again for every convolution).
_cache: dict[str, dict[str, list[list]] | str] = {}
_workers: dict[str, _Worker] = {}
_lock = threading.RLock()
_holds = 0


def _encode(value: Any) -> Any:
    """An op's argument as JSON: a tensor by its shape, strides and dtype (its values do not
    choose the kernel). Raises TypeError for anything else a convolution does not take."""
    if isinstance(value, torch.Tensor):
        return {"t": [list(value.shape), list(value.stride()), str(value.dtype)[6:]]}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise TypeError(f"cannot send {type(value).__name__} to the kernel probe")


def _decode(value: Any, device: torch.device) -> Any:
    if isinstance(value, dict):
        shape, stride, dtype = value["t"]
        t = torch.empty_strided(shape, stride, dtype=getattr(torch, dtype), device=device)
        return t.zero_()  # zeros: no denormals or NaNs to slow a CPU kernel down
    if isinstance(value, list):
        return [_decode(v, device) for v in value]
    return value


def settings(device: torch.device) -> dict[str, Any]:
    """What chooses the kernels besides their arguments, as the worker must set it."""
    chosen: dict[str, Any] = {
        "device": str(device),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }
    if device.type == "cuda":
        cudnn = torch.backends.cudnn
        chosen["cudnn"] = [cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32]
    else:
        chosen["mkldnn"] = torch.backends.mkldnn.enabled
        chosen["threads"] = torch.get_num_threads()
    return chosen


def available(device: torch.device) -> str | None:
    """Why kernels cannot be measured for `device` here, or None when they can."""
    if device.type == "cpu":
        return None
    if device.type != "cuda":
        return f"no kernel probe for {device.type} devices"
    if not torch.cuda.is_available():
        return "no GPU here"
    index = device.index if device.index is not None else 0
    if index >= torch.cuda.device_count():
        return f"this machine has no {device} (it sees {torch.cuda.device_count()} GPUs)"
    return None


class KernelProbe:
    """The probe one estimate uses: `events` per op, and what it measured or could not."""

    def __init__(self, device: torch.device):
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.settings = settings(device)
        self.key = json.dumps(self.settings, sort_keys=True)
        self.measured = 0  # distinct kernels with a measurement (cached ones included)
        self.seen: set[str] = set()  # the kernels the step being recorded has run
        self.failures: dict[str, str] = {}  # op -> why its allocations are unknown

    def begin(self) -> None:
        """A fake step starts: every kernel is new to it, as to the process it stands for."""
        self.seen.clear()

    def events(self, name: str, args: tuple, kwargs: dict) -> list[list] | None:
        """What op `name` allocates and frees on the device, in order (``_events``), or None
        if unknown: its first call's with these arguments in this step (cuDNN builds and
        tries engine configs then, oneDNN its primitives), a later call's after."""
        try:
            named = {k: _encode(v) for k, v in kwargs.items()}
            request = json.dumps([name, _encode(args), named])
        except TypeError as error:
            self.failures[name] = str(error)
            return None
        key = self.key + request
        with _lock:
            if key not in _cache:
                if len(_cache) >= _CACHE_LIMIT:
                    _cache.clear()
                _cache[key] = self._ask(request)
            found = _cache[key]
        if isinstance(found, str):  # why it could not be measured (this time or before)
            self.failures[name] = found
            return None
        first = key not in self.seen
        self.seen.add(key)
        self.measured += first
        return found["first" if first else "later"]

    def _ask(self, request: str) -> dict[str, list[list]] | str:
        """The worker's answer: the two traces, or why there is none."""
        worker = _workers.get(self.key)
        if worker is None or not worker.alive():
            try:
                worker = _Worker(self.settings)
            except ProbeError as error:
                return str(error)
            _workers[self.key] = worker
        try:
            answer = worker.ask(request)
        except ProbeError as error:
            worker.close()
            _workers.pop(self.key, None)
            return str(error)
        if "error" in answer:
            return str(answer["error"])
        return {"first": answer["first"], "later": answer["later"]}

    def close(self) -> None:
        """The estimate is done: its worker exits unless a plan or a search holds it."""
        with _lock:
            if _holds == 0:
                _close_all()

    def describe(self) -> list[str]:
        """Notes for the estimate: what was measured where, and what could not be."""
        notes = []
        what = _what(self.device)
        if self.measured:
            where = (
                torch.cuda.get_device_name(self.device)
                if self.device.type == "cuda"
                else f"this CPU, {self.settings['threads']} threads"
            )
            notes.append(
                f"convolutions' {what} measured on {where} (each distinct convolution run "
                "for real in a separate process)"
            )
        for name, why in sorted(self.failures.items()):
            notes.append(f"{name}: its {what} not counted ({why})")
        return notes


def _what(device: torch.device) -> str:
    return _CUDA_WHAT if device.type == "cuda" else _CPU_WHAT


def unmeasured(device: torch.device, why: str) -> str:
    """The estimate's note when nothing was measured (no probe ran) and why."""
    return f"convolutions' {_what(device)} not counted ({why})"


def notes_of(notes: list[str]) -> list[str]:
    """An estimate's notes about its convolutions' workspaces (``describe``'s or
    ``unmeasured``'s: all their wordings are this module's)."""
    failed = tuple(f": its {what} not counted (" for what in (_CUDA_WHAT, _CPU_WHAT))
    return [n for n in notes if n.startswith("convolutions' ") or any(f in n for f in failed)]


@contextlib.contextmanager
def held_open() -> Iterator[None]:
    """Keeps the workers across the estimates of a plan or a search (one CUDA context and
    one torch import, not one per estimate)."""
    global _holds
    with _lock:
        _holds += 1
    try:
        yield
    finally:
        with _lock:
            _holds -= 1
            if _holds == 0:
                _close_all()


def _close_all() -> None:
    for worker in list(_workers.values()):
        worker.close()
    _workers.clear()


atexit.register(_close_all)


_WORKER = "from memlab_rs.estimation._kernel_probe import _main; _main()"


class ProbeError(RuntimeError):
    """The worker could not start or answer."""


class _Worker:
    """One worker process: a JSON line in (settings, then a request per line), a JSON line
    out per request. Owned by the process that started it (a fork's child starts its own)."""

    def __init__(self, settings: dict[str, Any]):
        self.pid = os.getpid()
        try:
            self.proc = subprocess.Popen(
                # Not `-m`: the package imports this module first, and runpy would run a
                # second copy of it as __main__.
                [sys.executable, "-c", _WORKER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                bufsize=1,
            )
        except OSError as error:
            raise ProbeError(f"the kernel probe could not start: {error}") from error
        ready = self.ask(json.dumps(settings), _START_TIMEOUT_S)
        if "error" in ready:
            self.close()
            raise ProbeError(f"the kernel probe could not start: {ready['error']}")

    def alive(self) -> bool:
        return self.pid == os.getpid() and self.proc.poll() is None

    def ask(self, line: str, timeout: float = _CALL_TIMEOUT_S) -> dict[str, Any]:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(line + "\n")
            stdin.flush()
            ready, _, _ = select.select([stdout], [], [], timeout)
            reply = stdout.readline() if ready else ""
        except (OSError, ValueError) as error:
            raise ProbeError(f"the kernel probe stopped answering: {error}") from error
        except BaseException:
            # Interrupted (KeyboardInterrupt, a signal handler's exception) between a
            # request and its answer: the answer would go to the next request. Stop it.
            self.proc.kill()
            self.proc.wait()
            raise
        if not reply:
            code = self.proc.poll()
            why = (
                f"exited with code {code}" if code is not None else f"no answer in {timeout:.0f} s"
            )
            raise ProbeError(f"the kernel probe {why}")
        answer: dict[str, Any] = json.loads(reply)
        return answer

    def close(self) -> None:
        if self.pid != os.getpid():
            return  # a fork's copy: the parent's worker is the parent's
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# The worker's side.


class _Meter:
    """What an op allocates and frees on the device, from the allocator's own trace."""

    def __init__(self, device: torch.device):
        self.device = device
        if device.type == "cpu":
            from memlab_rs import _core

            self.core = _core
            mode = _core._cpu_start()
            if mode != "allocator":
                raise RuntimeError(f"CPU memory is counted by {mode!r} here, not its allocator")

    def events(self, run) -> list[list]:
        if self.device.type == "cuda":
            from torch.cuda import memory

            torch.cuda.synchronize(self.device)
            memory._record_memory_history(max_entries=1_000_000, context=None, stacks="python")
            try:
                out = run()
                torch.cuda.synchronize(self.device)
                snapshot = memory._snapshot(self.device)
            finally:
                memory._record_memory_history(None)
            del out
            traces = snapshot["device_traces"]
            index = self.device.index or 0
            entries = traces[index] if index < len(traces) else []
        else:
            core = self.core
            core._cpu_trace_start(1_000_000)
            try:
                out = run()
            finally:
                trace = core._cpu_trace_stop()
            del out
            if trace["memlab_rs"]["dropped"]:
                raise RuntimeError("the CPU trace dropped entries")
            entries = trace["device_traces"][0] if trace["device_traces"] else []
        return _events(entries)


def _events(entries: list[dict[str, Any]]) -> list[list]:
    """An op's allocator trace as what the estimate replays, in order: ``["o", bytes]`` for
    a block still allocated at the end (an output), ``["a", bytes]`` for one freed inside
    the op (scratch) and ``["f", i]`` for its free (`i`: the index of its ``"a"``)."""
    events: list[list] = []
    open_at: dict[int, int] = {}  # address -> index of its allocation in `events`
    for entry in entries:
        action = entry["action"]
        if action == "alloc":
            open_at[entry["addr"]] = len(events)
            events.append(["o", entry["size"]])
        elif action == "free_completed" and entry["addr"] in open_at:
            at = open_at.pop(entry["addr"])
            events[at][0] = "a"
            events.append(["f", at])
    return events


def _configure(settings: dict[str, Any]) -> torch.device:
    device = torch.device(settings["device"])
    torch.use_deterministic_algorithms(settings["deterministic_algorithms"])
    if device.type == "cuda":
        enabled, benchmark, deterministic, tf32 = settings["cudnn"]
        cudnn = torch.backends.cudnn
        cudnn.enabled, cudnn.benchmark = enabled, benchmark
        cudnn.deterministic, cudnn.allow_tf32 = deterministic, tf32
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)  # the context, before anything is measured
    else:
        torch.backends.mkldnn.enabled = settings["mkldnn"]
        torch.set_num_threads(settings["threads"])
    return device


def _measure(meter: _Meter, device: torch.device, request: str) -> dict[str, list[list]]:
    """One request's allocations on the op's first call (new to this process: cuDNN's
    engine configs built and tried or searched, oneDNN's primitives made) and on its
    second."""
    name, args, kwargs = json.loads(request)
    op: Any = torch.ops.aten
    for part in name.split(".")[1:]:
        op = getattr(op, part)
    real_args = _decode(args, device)
    real_kwargs = {k: _decode(v, device) for k, v in kwargs.items()}
    first = meter.events(lambda: op(*real_args, **real_kwargs))
    return {"first": first, "later": meter.events(lambda: op(*real_args, **real_kwargs))}


def _serve(lines, write) -> None:
    """The worker's loop: the settings first, then one answer per request."""
    meter = None
    device = torch.device("cpu")
    for line in lines:
        try:
            if meter is None:
                device = _configure(json.loads(line))
                meter = _Meter(device)
                write({"ready": True})
            else:
                write(_measure(meter, device, line))
        except Exception as error:  # noqa: BLE001 - every failure is an answer to the estimate
            first = (str(error).strip().splitlines() or [""])[0]
            write({"error": f"{type(error).__name__}: {first}"})
            if device.type == "cuda":
                torch.cuda.empty_cache()


def _main() -> None:
    out = sys.stdout

    def write(answer: dict[str, Any]) -> None:
        out.write(json.dumps(answer) + "\n")
        out.flush()

    _serve(sys.stdin, write)
