"""The leak check's recordings: one per device, from the start of the first warm-up step to
the end of the last measured step, with each step's end marked in it; at the stop, the
entries are reduced to one record per allocation (its stack, its bytes, the step that made
it, the step that freed it), the analysis's input (``_core.doctor.leaks_analyse``).

- CPU: memlab_rs's CPU trace (``_core._cpu_trace_start``: the allocator hook, every CPU
  storage torch allocates with its Python stack); a step's end is the trace's position then
  (``_core._cpu_trace_mark``), exact whatever thread allocates.
- CUDA: torch's allocation history with Python stacks (``_sources.cuda_history``); a step's
  end is a ``snapshot`` entry the history takes (``cuda_history.mark``), tagged with a marker
  of ours where torch can tag entries (2.10+). Sizes are the caching allocator's blocks
  (requests rounded up to 512 bytes).

What was allocated before the recording began is no one's site: frees of it are ignored.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import torch

from .. import _core
from .._sources import (
    cpu_source,  # noqa: F401  (the CPU recording's torch glue)
    cuda_history,
)

#: Entries a recording keeps (a ring buffer: the oldest go first, and the result says so).
DEFAULT_MAX_ENTRIES = 1_000_000


def exclude_parts() -> list[str]:
    """Path parts whose frames are not a site: torch, memlab_rs and the standard library
    (``<stdlib>``, read by the analysis)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return [
        os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
        "-packages/torch/",
        package + os.sep,
        "<stdlib>",
    ]


class Recording:
    """One device's recording; ``start()`` begins the first step, ``mark()`` ends one,
    ``stop()`` ends the recording (always call it: it turns off what ``start`` turned on).

    ``stop()`` may be called any number of times, and after a ``start()`` that was cut
    short: a KeyboardInterrupt can land between any two bytecodes, so whether a recording
    is ours to stop is settled before the call that turns it on, and whether it is still on
    is asked of what turned it on, never of a flag set after that call returned."""

    device: str

    def start(self) -> None:
        raise NotImplementedError

    def mark(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def reduce(self, steps: int) -> dict[str, Any]:
        """The analysis's input for this device over the first ``steps`` recorded steps."""
        raise NotImplementedError


class CpuRecording(Recording):
    def __init__(self, max_entries: int):
        self.device = "cpu"
        self.max_entries = max_entries
        self.marks: list[int] = []
        self.snapshot: dict[str, Any] | None = None
        self.running = False

    def start(self) -> None:
        # A trace already on is someone else's: the start below refuses it, and stop()
        # must leave it running.
        self.running = not _core._cpu_trace_active()
        try:
            _core._cpu_trace_start(self.max_entries)
        except RuntimeError as error:
            self.running = False
            raise RuntimeError(f"the leak check cannot record CPU tensors: {error}") from None
        self.marks = [_core._cpu_trace_mark()]

    def mark(self) -> None:
        self.marks.append(_core._cpu_trace_mark())

    def stop(self) -> None:
        if self.running and _core._cpu_trace_active():
            self.snapshot = _core._cpu_trace_stop()
        self.running = False

    def reduce(self, steps: int) -> dict[str, Any]:
        assert self.snapshot is not None
        ours = self.snapshot["memlab_rs"]
        dropped = int(ours["dropped"])
        notices = []
        if dropped > self.marks[0]:
            notices.append(
                f"the recording kept its newest {self.max_entries:,} entries and dropped "
                f"{dropped - self.marks[0]:,} of the steps': allocations made before them are "
                "not counted; raise max_entries"
            )
        if ours["no_stack"]:
            notices.append(
                f"{ours['no_stack']:,} allocations had no Python stack (made on a thread not "
                "running Python): they are counted under (no Python stack)"
            )
        ends = [max(0, m - dropped) for m in self.marks[: steps + 1]]
        return _reduce(self.device, self.snapshot["device_traces"][0], ends, notices)


class CudaRecording(Recording):
    def __init__(self, device: str, max_entries: int):
        self.device = device
        self.index = int(device[5:])
        self.max_entries = max_entries
        self.token = uuid.uuid4().hex
        self.marks: list[str] = []
        self.snapshot: dict[str, Any] | None = None
        self.running = False
        self.we_enabled = False
        self.tagged = False
        self.start_us = 0

    def start(self) -> None:
        cuda_history.ensure_initialised()
        self.we_enabled = not cuda_history.history_enabled()
        self.running = True  # from here on stop() turns off what this turned on
        if self.we_enabled:
            cuda_history.enable(self.max_entries)
        self.tagged = cuda_history.metadata_supported()
        self.start_us = time.time_ns() // 1000 - 1000
        self.mark()

    def mark(self) -> None:
        marker = f"memlab_rs-leaks-{self.token}-{len(self.marks)}"
        with torch.cuda.device(self.index):
            cuda_history.mark(marker)
        self.marks.append(marker)

    def stop(self) -> None:
        if not self.running:
            return
        try:
            self.snapshot = cuda_history.snapshot()
        finally:
            if self.we_enabled:
                cuda_history.disable()
            self.running = False

    def reduce(self, steps: int) -> dict[str, Any]:
        assert self.snapshot is not None
        traces = self.snapshot["device_traces"]
        entries = traces[self.index] if self.index < len(traces) else []
        wanted = self.marks[: steps + 1]
        if self.tagged:
            where = {marker: i for i, marker in enumerate(wanted)}
            found = [-1] * len(wanted)
            for i, entry in enumerate(entries):
                if entry["action"] == "snapshot" and entry.get("user_metadata") in where:
                    found[where[entry["user_metadata"]]] = i
        else:
            # Without tags: our snapshot entries, in order, from the recording's start (a
            # snapshot the step takes itself would move a step's end).
            found = [
                i
                for i, entry in enumerate(entries)
                if entry["action"] == "snapshot" and entry.get("time_us", 0) >= self.start_us
            ][: len(wanted)]
        notices = []
        if not self.we_enabled:
            notices.append(
                "torch's allocation history was already on: its own settings were kept (sites "
                "need context='alloc' or 'all' and Python stacks)"
            )
        if len(found) < len(wanted) or min(found) < 0:
            raise RuntimeError(
                f"the leak check lost the start of its recording on {self.device}: torch's "
                f"allocation history keeps its newest entries only ({self.max_entries:,} "
                "unless you turned it on yourself); raise max_entries or measure fewer steps"
            )
        # The entries after each step's end marker are the next step's.
        ends = [i + 1 for i in found]
        return _reduce(self.device, entries, ends, notices)


def _reduce(
    device: str, entries: list[dict[str, Any]], ends: list[int], notices: list[str]
) -> dict[str, Any]:
    """One record per allocation made in the recorded steps that outlived its own step.
    ``ends[k]`` is the index of step k's first entry; ``ends[-1]`` is past the last step."""
    live: dict[int, int] = {}
    made: list[list[Any]] = []  # [frames, bytes, step made, step freed]
    step = 0
    for i in range(ends[0], min(ends[-1], len(entries))):
        while i >= ends[step + 1]:
            step += 1
        entry = entries[i]
        action = entry["action"]
        if action == "alloc":
            live[entry["addr"]] = len(made)
            made.append([entry.get("frames") or [], int(entry["size"]), step, None])
        elif action in ("free_requested", "free_completed"):
            # The first of the two ends the tensor (the second, for CUDA, is the block
            # coming back after its streams finished).
            j = live.pop(entry["addr"], None)
            if j is not None:
                made[j][3] = step
    frames: list[tuple[str, int, str]] = []
    frame_ids: dict[tuple[str, int, str], int] = {}
    stacks: list[list[int]] = []
    stack_ids: dict[tuple[int, ...], int] = {}
    by_list: dict[int, int | None] = {}  # id(frames list) -> stack id, while entries live
    allocations = []
    for listed, nbytes, born, freed in made:
        if freed is not None and freed <= born:
            continue  # freed in its own step: it changes no step's end
        key = id(listed)
        if key not in by_list:
            ids = []
            for frame in listed:
                f = (str(frame["filename"]), int(frame["line"]), str(frame["name"]))
                if f not in frame_ids:
                    frame_ids[f] = len(frames)
                    frames.append(f)
                ids.append(frame_ids[f])
            if ids:
                by_list[key] = stack_ids.setdefault(tuple(ids), len(stacks))
                if by_list[key] == len(stacks):
                    stacks.append(ids)
            else:
                by_list[key] = None
        allocations.append((by_list[key], nbytes, born, freed))
    return {
        "device": device,
        "frames": frames,
        "stacks": stacks,
        "allocations": allocations,
        "notices": notices,
    }
