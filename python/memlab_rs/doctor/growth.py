"""Growth across steps: the leak check. ``leaks(step_fn)`` calls a step repeatedly;
``leak_check()`` watches a loop that is not one function (``.step()`` at the end of each
iteration). Both return a ``LeakResult``: per device, the source lines whose memory grew at
every measured step, as ``file:line (function)`` with the bytes per step.

How it decides: every allocation from the start of the first warm-up step to the end of the
last measured step is recorded with its Python stack. A site is the innermost frame of your
own code (not torch's, memlab_rs's or the standard library's). Its live bytes at the end of
a step are the bytes its allocations hold then (warm-up's included, so a cache warm-up
filled that only turns over stays flat). A site grows when its live bytes rise at every
measured step; its growth per step is the rise from the first measured step's end to the
last's, divided by ``steps - 1``: exact when each step adds the same. A steady loop, where
what a step makes is freed by the next, reports nothing.

What is watched: torch's CPU tensors (every storage torch's CPU allocator makes, through
memlab_rs's allocator hook) and, on CUDA, the caching allocator's blocks (torch's allocation
history with Python stacks; sizes are the allocator's blocks, requests rounded up to 512
bytes). Plain Python objects (a list of floats, a dict of strings) are not: their sizes
depend on the interpreter, and watching them (``tracemalloc``) slows every Python allocation
of the program; use ``tracemalloc.take_snapshot().compare_to(...)`` for those.

Cost: nothing until called; while it runs, about a microsecond per CPU allocation (a Python
stack read) and torch's history cost per CUDA allocation (about 2 us); all of it is turned
off when the check ends, whether the steps return, raise or are interrupted.

>>> import torch, memlab_rs
>>> kept = []
>>> def step():
...     kept.append(torch.empty(1024, dtype=torch.uint8))  # 1 KiB kept per step
...     torch.ones(4096).sum()  # a temporary: freed in its step
>>> result = memlab_rs.leaks(step, steps=4, warmup=1, device="cpu")
>>> [(s["location"].rsplit(":", 1)[1], s["bytes_per_step"]) for s in result.sites()]
[('2 (step)', 1024.0)]
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import torch

from .. import _args, _core, results
from .._torch import cuda_index_exists, device_key
from ._leak_recording import (
    DEFAULT_MAX_ENTRIES,
    CpuRecording,
    CudaRecording,
    Recording,
    exclude_parts,
)
from .leak_result import LeakResult

#: The defaults of ``leaks()``.
DEFAULT_STEPS = 5
DEFAULT_WARMUP = 1


def _devices(device: Any) -> list[str]:
    """The devices checked: CPU tensors, plus the current CUDA device when torch sees a GPU
    (``None``); else the one given."""
    if device is None:
        keys = ["cpu"]
        if torch.cuda.is_available():
            keys.append(device_key("cuda"))
        return keys
    key = device_key(device, "device")
    if key != "cpu" and not key.startswith("cuda:"):
        raise ValueError(
            f"device={device!r}: the leak check watches CPU tensors ('cpu') or a CUDA device "
            "('cuda', 'cuda:N'), or both with device=None"
        )
    if key.startswith("cuda:"):
        cuda_index_exists(int(key[5:]), f"device={device!r}")
    return [key]


class LeakCheck:
    """A leak check over a loop: call ``step()`` at the end of each iteration; the first
    ``warmup`` iterations are warm-up, the next ``steps`` (or all until ``stop()``, with
    ``steps=None``) are measured. Use it as a context manager (``leak_check()``) or with
    ``start()``/``stop()``; the result is ``.result`` (a ``LeakResult``) once it stopped.

    ``device``: ``"cpu"`` (CPU tensors), ``"cuda"``/``"cuda:N"``/``N``, or None (CPU
    tensors, and the current CUDA device when torch sees a GPU: this initialises CUDA).
    ``max_entries``: the allocations and frees each recording keeps (the oldest go first,
    and the result says so).

    >>> import torch, memlab_rs
    >>> kept = []
    >>> with memlab_rs.leak_check(warmup=1, device="cpu") as check:
    ...     for i in range(4):
    ...         kept.append(torch.zeros(256))  # 1,024 bytes kept per iteration
    ...         check.step()
    >>> [s["bytes_per_step"] for s in check.result.sites("cpu")]
    [1024.0]
    """

    def __init__(
        self,
        steps: int | None = None,
        warmup: int = DEFAULT_WARMUP,
        device: Any = None,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ):
        self.steps = None if steps is None else _args.count(steps, "steps", minimum=2)
        self.warmup = _args.count(warmup, "warmup")
        self.max_entries = _args.count(max_entries, "max_entries", minimum=1)
        self.devices = _devices(device)
        self._explicit = device is not None
        self.result: LeakResult | None = None
        self._recordings: list[Recording] = []
        self._skipped: dict[str, str] = {}
        self._calls = 0
        self._running = False
        self._cwd: str | None = None

    def start(self) -> LeakCheck:
        """Begin the first step. A start that fails turns off what it turned on."""
        if self._running:
            raise RuntimeError("this leak check is already running; stop() it first")
        self.result = None
        self._calls = 0
        self._recordings = []
        self._skipped = {}
        try:
            self._cwd = os.getcwd()
        except OSError:  # the working directory is gone: paths are shown in full
            self._cwd = None
        try:
            for key in self.devices:
                if key == "cpu":
                    recording: Recording = CpuRecording(self.max_entries)
                else:
                    recording = CudaRecording(key, self.max_entries)
                # Listed before it starts: an interrupt inside start() finds it to stop.
                self._recordings.append(recording)
                try:
                    recording.start()
                except RuntimeError as error:
                    # With device=None, CPU tensors are checked where the hook works; a
                    # device asked for by name must be checked or refused.
                    if self._explicit or key != "cpu":
                        raise
                    self._recordings.remove(recording)
                    self._skipped[key] = str(error)
                    continue
            self._running = True
        except BaseException:
            self._turn_off()
            raise
        return self

    def step(self) -> None:
        """End one iteration (warm-up or measured). After ``warmup + steps`` calls the
        recording stops and ``result`` is ready; later calls do nothing."""
        if not self._running:
            if self.result is not None:
                return  # the measured steps are done
            raise RuntimeError("this leak check is not running: start() it, or use `with`")
        try:
            for recording in self._recordings:
                recording.mark()
        except BaseException:
            self._turn_off()
            raise
        self._calls += 1
        if self.steps is not None and self._calls >= self.warmup + self.steps:
            self.stop()

    def stop(self) -> LeakResult:
        """End the recording (what the last ``step()`` did not end is left out) and analyse
        it. At least ``warmup + 2`` ``step()`` calls are needed: one step shows no trend."""
        if not self._running:
            if self.result is not None:
                return self.result
            raise RuntimeError("this leak check is not running; start() it first")
        self._turn_off()
        measured = self._calls - self.warmup
        if measured < 2:
            raise RuntimeError(
                f"the leak check saw {self._calls} step() call(s) with warmup={self.warmup}: "
                "it needs at least 2 measured steps after the warm-up (one step shows no "
                "trend); call step() at the end of every iteration"
            )
        self.result = self._analyse(measured)
        return self.result

    def _stop_recordings(self) -> None:
        """Turn off every recording, even when one fails to stop."""
        error: BaseException | None = None
        for recording in self._recordings:
            try:
                recording.stop()
            except BaseException as e:  # the others must still stop
                error = error or e
        if error is not None:
            raise error

    def _analyse(self, measured: int) -> LeakResult:
        devices = [r.reduce(self.warmup + measured) for r in self._recordings]
        for key, why in self._skipped.items():
            devices.append({"device": key, "notices": [f"not checked: {why}"]})
        self._recordings = []  # their snapshots: no longer needed
        recording = {
            "warmup": self.warmup,
            "steps": measured,
            "exclude": exclude_parts(),
            "cwd": self._cwd,
            "devices": devices,
        }
        data = _core.doctor.leaks_analyse(json.dumps(recording, ensure_ascii=False))
        return LeakResult._from_json(data, results.run_meta(self.devices[0]))

    def __enter__(self) -> LeakCheck:
        return self.start()

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        if exc_type is None:
            self.stop()
        else:  # the loop raised: turn everything off, and let it propagate
            self._turn_off()

    def _turn_off(self) -> None:
        """Turn off whatever is on, however far start(), step() or stop() got (each
        recording's stop() is safe to repeat)."""
        self._stop_recordings()
        self._running = False


def leak_check(
    steps: int | None = None,
    warmup: int = DEFAULT_WARMUP,
    device: Any = None,
    max_entries: int = DEFAULT_MAX_ENTRIES,
) -> LeakCheck:
    """A leak check over a loop that is not one function: ``with leak_check() as check:``,
    then ``check.step()`` at the end of every iteration; ``check.result`` afterwards. The
    first ``warmup`` iterations are warm-up; ``steps`` measured ones end the recording (None:
    every iteration until the ``with`` block ends). See ``LeakCheck``.

    >>> import memlab_rs, torch
    >>> with memlab_rs.leak_check(device="cpu") as check:
    ...     for i in range(4):
    ...         x = torch.ones(1024) * 2  # replaced each iteration: steady
    ...         check.step()
    >>> check.result.sites()
    []
    """
    return LeakCheck(steps=steps, warmup=warmup, device=device, max_entries=max_entries)


def leaks(
    step_fn: Callable[[], Any],
    steps: int = DEFAULT_STEPS,
    warmup: int = DEFAULT_WARMUP,
    device: Any = None,
    max_entries: int = DEFAULT_MAX_ENTRIES,
) -> LeakResult:
    """Call ``step_fn()`` ``warmup + steps`` times and return the sites whose memory grew at
    every one of the ``steps`` measured calls, with their bytes per step (a ``LeakResult``;
    print it). ``device``: ``"cpu"``, ``"cuda"``/``"cuda:N"``, or None (CPU tensors, and the
    current CUDA device when torch sees a GPU). Pass arguments with a lambda or
    ``functools.partial``.

    >>> import memlab_rs, torch
    >>> history = []
    >>> def train_step():
    ...     loss = torch.ones(64).sum()
    ...     history.append(loss)  # keeps each step's loss tensor: a leak
    >>> print(memlab_rs.leaks(train_step, device="cpu"))  # doctest: +ELLIPSIS
    Leak check: 5 steps measured after 1 warm-up step
    cpu (CPU tensors): 1 site grew at every one of the 5 steps
      +4 bytes/step  ...:2 (train_step)
          live at each step's end: 8 B, 12 B, 16 B, 20 B, 24 B; 6 allocations alive at the end
    """
    _args.function(step_fn, "step_fn", "a function to call with no arguments (one step)")
    steps = _args.count(steps, "steps", minimum=2)
    check = LeakCheck(steps=steps, warmup=warmup, device=device, max_entries=max_entries)
    # Not `with check:` -- an interrupt landing inside __enter__ skips __exit__; this
    # finally also covers a start() cut short.
    try:
        check.start()
        for _ in range(check.warmup + steps):
            step_fn()
            check.step()
    finally:
        if check.result is None:
            check._turn_off()
    assert check.result is not None
    return check.result
