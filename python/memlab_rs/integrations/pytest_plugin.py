"""The pytest plugin's measuring side: memory limits on tests, and every test's peak.

pytest loads ``pytest_memlab_rs`` (the ``pytest11`` entry point, which imports nothing
heavy); it registers :class:`MemlabPlugin` from here only when a collected test carries
``@pytest.mark.limit_memory(limit)`` / ``@pytest.mark.limit_cuda_memory(limit,
device=None)``, or ``--memlab`` / ``--memlab-save DIR`` is given.

What is measured, on each device, is the test's **call** (the test function, not its
fixtures' setup and teardown: a fixture shared by many tests would otherwise be charged to
whichever test set it up first, and what a fixture hands the test is already allocated when
the call begins)::

    peak = the highest allocated bytes during the call - the allocated bytes when it began

so a test that allocates a 1 MiB tensor and frees it has a peak of 1,048,576 bytes, whatever
was allocated before it. Memory allocated before the call and freed during it lowers the
peak (the measure is what the process needed above what it held, the figure an
out-of-memory error depends on).

- CPU (``limit_memory``, and ``--memlab``'s ``cpu``): torch's CPU allocator as memlab_rs's
  CPU source counts it (every CPU storage torch allocates, on any thread): CPU *tensors*,
  not Python objects, numpy arrays or other libraries' memory.
- CUDA (``limit_cuda_memory``, and ``--memlab``'s ``cuda:N``): the caching allocator's
  allocated bytes (``torch.cuda.max_memory_allocated``), whose peak the plugin resets
  before each call (``torch.cuda.reset_peak_memory_stats``). A test that resets the peak
  itself makes its peak the one since its own reset.

A test with a limit is also traced (``memlab_rs.trace.Tracer``) so that its failure shows
which lines allocated what was alive at the peak.

``@pytest.mark.limit_leaks(limit, calls=5, warmup=1, device=None)`` asks another question,
in the spirit of pytest-memray's ``limit_leaks``: does memory grow when the test's body runs
again? pytest-memray counts what is still allocated when one call ends, which flags every
cache and lazily built object as a leak; here the body (the test function, not its
fixtures) is called ``warmup + calls`` times with the same fixture values, under
``memlab_rs.leaks``, and the test fails when a source line's live bytes rose at every one
of the ``calls`` measured calls by more than ``limit`` a call; the failure names each such
line as ``file:line (function)`` with its bytes per call. The body must be safe to call
repeatedly (a test that consumes a fixture's iterator is not). ``device``: ``"cpu"`` (CPU
tensors), ``"cuda"``/``"cuda:N"``, or None (CPU tensors, and the current CUDA device when
torch sees one). It cannot share a test with ``limit_memory``: both record CPU allocations
and only one CPU recording runs at a time.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from .. import _args, _core, results
from .._torch import cuda_index_exists, device_key
from ..doctor import leaks
from ..test_memory import PytestMemoryResult
from ..trace import Tracer  # (and through it _sources.cpu_source, the CPU source's glue)

MARKERS = ("limit_memory", "limit_cuda_memory")
#: Rows alive at the peak shown in a limit failure.
FAILURE_ROWS = 5
#: Rows alive at the peak kept in a saved result.
SAVED_ROWS = 20


def _limit_memory(limit: Any) -> None: ...


def _limit_cuda_memory(limit: Any, device: Any = None) -> None: ...


def _limit_leaks(limit: Any, calls: Any = 5, warmup: Any = 1, device: Any = None) -> None: ...


_SIGNATURES = {
    "limit_memory": inspect.signature(_limit_memory),
    "limit_cuda_memory": inspect.signature(_limit_cuda_memory),
    "limit_leaks": inspect.signature(_limit_leaks),
}
_USAGE = {
    "limit_memory": "@pytest.mark.limit_memory(limit), e.g. @pytest.mark.limit_memory('512 MB')",
    "limit_cuda_memory": "@pytest.mark.limit_cuda_memory(limit, device=None), e.g. "
    "@pytest.mark.limit_cuda_memory('2 GB')",
    "limit_leaks": "@pytest.mark.limit_leaks(limit, calls=5, warmup=1, device=None), e.g. "
    "@pytest.mark.limit_leaks('1 KB', calls=5)",
}


@dataclass(frozen=True)
class Limit:
    """One memory limit marker of a test, checked at collection."""

    #: "limit_memory" or "limit_cuda_memory"
    marker: str
    #: the marker as the test wrote it: ``limit_memory('512 KiB')``
    written: str
    limit_bytes: int
    #: "cpu", or the CUDA device as written (None: the current CUDA device)
    device: Any


def written(marker: Any) -> str:
    """A marker as a test writes it: ``limit_memory('512 KiB')``.

    >>> import pytest
    >>> written(pytest.mark.limit_cuda_memory("2 GB", device=1).mark)
    "limit_cuda_memory('2 GB', device=1)"
    """
    parts = [repr(a) for a in marker.args] + [f"{k}={v!r}" for k, v in marker.kwargs.items()]
    return f"{marker.name}({', '.join(parts)})"


def parse_limit(marker: Any) -> Limit:
    """The limit of a ``limit_memory`` or ``limit_cuda_memory`` marker; a ValueError that
    names the marker and says what is wrong otherwise.

    >>> import pytest
    >>> parse_limit(pytest.mark.limit_memory("1.5GiB").mark).limit_bytes
    1610612736
    >>> parse_limit(pytest.mark.limit_memory("lots").mark)
    Traceback (most recent call last):
    ...
    ValueError: @pytest.mark.limit_memory('lots'): "lots" is not a size: it does not ...
    """
    text = written(marker)
    try:
        bound = _SIGNATURES[marker.name].bind(*marker.args, **marker.kwargs)
    except TypeError as error:
        raise ValueError(f"@pytest.mark.{text}: {error}; write {_USAGE[marker.name]}") from None
    try:
        limit_bytes = _core.parse_size(bound.arguments["limit"])
    except (TypeError, ValueError) as error:
        raise ValueError(f"@pytest.mark.{text}: {error}") from None
    if marker.name == "limit_memory":
        return Limit(marker.name, text, limit_bytes, "cpu")
    device = bound.arguments.get("device")
    try:
        key = device_key("cuda" if device is None else device, "device")
    except (TypeError, ValueError) as error:
        raise ValueError(f"@pytest.mark.{text}: {error}") from None
    if not key.startswith("cuda:"):
        raise ValueError(
            f"@pytest.mark.{text}: device={device!r} is not a CUDA device; "
            "limit CPU tensors with @pytest.mark.limit_memory"
        )
    return Limit(marker.name, text, limit_bytes, device)


@dataclass(frozen=True)
class LeakLimit:
    """A test's ``limit_leaks`` marker, checked at collection."""

    #: the marker as the test wrote it: ``limit_leaks('1 KB', calls=5)``
    written: str
    limit_bytes: int
    calls: int
    warmup: int
    #: "cpu", a CUDA device as written, or None (CPU tensors and the current CUDA device)
    device: Any


def parse_leak_limit(marker: Any) -> LeakLimit:
    """The limit of a ``limit_leaks`` marker; a ValueError that names the marker and says
    what is wrong otherwise.

    >>> import pytest
    >>> parse_leak_limit(pytest.mark.limit_leaks("1 KiB", calls=3).mark).calls
    3
    >>> parse_leak_limit(pytest.mark.limit_leaks(0, calls=1).mark)
    Traceback (most recent call last):
    ...
    ValueError: @pytest.mark.limit_leaks(0, calls=1): calls must be an int >= 2, got 1 ...
    """
    text = written(marker)
    try:
        bound = _SIGNATURES[marker.name].bind(*marker.args, **marker.kwargs)
        bound.apply_defaults()
    except TypeError as error:
        raise ValueError(f"@pytest.mark.{text}: {error}; write {_USAGE[marker.name]}") from None
    arguments = bound.arguments
    try:
        limit_bytes = _core.parse_size(arguments["limit"])
        calls = _args.count(arguments["calls"], "calls", minimum=2)
        warmup = _args.count(arguments["warmup"], "warmup")
        device = arguments["device"]
        if device is not None:
            key = device_key(device, "device")
            if key != "cpu" and not key.startswith("cuda:"):
                raise ValueError(f"device={device!r}: use 'cpu', 'cuda', 'cuda:N' or None")
    except (TypeError, ValueError) as error:
        hint = " (one measured call shows no trend)" if "calls must" in str(error) else ""
        raise ValueError(f"@pytest.mark.{text}: {error}{hint}") from None
    return LeakLimit(text, limit_bytes, calls, warmup, device)


def file_name(nodeid: str) -> str:
    """A file name for a test's result: its node id with every run of characters other than
    letters, digits, ``.``, ``_`` and ``-`` made one ``_`` (long ones cut, with a hash of the
    node id so that they stay apart).

    >>> file_name("tests/test_a.py::test_big[2-cpu]")
    'tests_test_a.py_test_big_2-cpu.json'
    """
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", nodeid).strip("_") or "test"
    if len(name) > 150:
        name = name[:120] + "-" + hashlib.sha1(nodeid.encode()).hexdigest()[:12]
    return name + ".json"


def _outcome(report: Any) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    return str(report.outcome)


def _device_order(device: str) -> tuple[int, int]:
    return (0, 0) if device == "cpu" else (1, int(device.split(":")[1]))


class MemlabPlugin:
    """Measures tests' calls: those with a limit always, every test with ``--memlab`` or
    ``--memlab-save``; fails those over their limit; lists and saves the results."""

    def __init__(self, config: Any):
        self.config = config
        self.save_dir: str | None = config.getoption("memlab_save")
        self.table = bool(config.getoption("memlab"))
        self.every = self.table or self.save_dir is not None
        self.top = int(config.getoption("memlab_top"))
        #: node id -> the test's limits (from its markers, checked at collection)
        self.limits: dict[str, list[Limit]] = {}
        #: node id -> the test's limit_leaks marker
        self.leak_limits: dict[str, LeakLimit] = {}
        #: (node id, outcome, measurements) of each test measured, in run order
        self.records: list[tuple[str, str, list[dict[str, Any]]]] = []
        self._pending: dict[str, list[dict[str, Any]]] = {}
        self._sources: dict[str, Any] | None = None
        self._saved = 0
        self._root = str(config.rootpath) + os.sep
        # Absolute now: a test may change the working directory (monkeypatch.chdir).
        self._save_path = None if self.save_dir is None else os.path.abspath(self.save_dir)
        if self._save_path is not None:
            os.makedirs(self._save_path, exist_ok=True)

    # -- collection ----------------------------------------------------------------------
    def check_limits(self, items: list[Any]) -> None:
        """Parse every limit marker of ``items``; a malformed one stops the session before
        any test runs, with every malformed marker named."""
        errors = []
        for item in items:
            limits = []
            for name in MARKERS:
                marker = item.get_closest_marker(name)
                if marker is None:
                    continue
                try:
                    limits.append(parse_limit(marker))
                except ValueError as error:
                    errors.append(f"{item.nodeid}: {error}")
            self.limits[item.nodeid] = limits
            marker = item.get_closest_marker("limit_leaks")
            if marker is not None:
                try:
                    self.leak_limits[item.nodeid] = parse_leak_limit(marker)
                except ValueError as error:
                    errors.append(f"{item.nodeid}: {error}")
                if item.get_closest_marker("limit_memory") is not None:
                    errors.append(
                        f"{item.nodeid}: @pytest.mark.limit_leaks and "
                        "@pytest.mark.limit_memory cannot share a test (each records CPU "
                        "allocations, and one CPU recording runs at a time): split the test"
                    )
        if errors:
            raise pytest.UsageError(
                "memlab_rs: malformed memory limits, so no test ran:\n  " + "\n  ".join(errors)
            )

    # -- the call ------------------------------------------------------------------------
    # trylast: the innermost wrapper, so that only the test function runs inside the window
    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(self, item: Any) -> Any:
        limits = self.limits.get(item.nodeid, [])
        if not limits and not self.every:
            return (yield)
        call = _Call(self, item.nodeid, limits)
        try:
            result = yield
        except BaseException:
            self._pending[item.nodeid] = call.stop()
            raise
        measurements = self._pending[item.nodeid] = call.stop()
        failures = [
            _core.test_memory.limit_text(
                json.dumps(m), call.markers[m["device"]], FAILURE_ROWS
            )
            for m in measurements
            if m["limit_bytes"] is not None and m["peak_bytes"] > m["limit_bytes"]
        ]
        if failures:
            pytest.fail("\n".join(failures).rstrip("\n"), pytrace=False)
        return result

    # tryfirst: the body is ours to call (repeatedly) before pytest's own call runs it once
    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: Any) -> bool | None:
        limit = self.leak_limits.get(pyfuncitem.nodeid)
        if limit is None:
            return None
        function = pyfuncitem.obj
        if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
            pytest.fail(
                f"memlab_rs: @pytest.mark.{limit.written} calls the test's body repeatedly, "
                "which an async test's plugin runs; use memlab_rs.leaks inside the test",
                pytrace=False,
            )
        device = limit.device
        if device is not None and device != "cpu":
            if not torch.cuda.is_available():
                pytest.fail(
                    f"memlab_rs: {pyfuncitem.nodeid} has @pytest.mark.{limit.written}, but "
                    "torch sees no CUDA device here; skip it where there is no GPU",
                    pytrace=False,
                )
            try:
                cuda_index_exists(int(device_key(device)[5:]), f"@pytest.mark.{limit.written}")
            except ValueError as error:
                pytest.fail(f"memlab_rs: {pyfuncitem.nodeid}: {error}", pytrace=False)
        # As pytest's own pytest_pyfunc_call: the test's arguments from its fixtures.
        arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
        result = leaks(
            lambda: function(**arguments), steps=limit.calls, warmup=limit.warmup, device=device
        )
        if any(s["bytes_per_step"] > limit.limit_bytes for s in result.sites()):
            message = _core.doctor.leaks_limit_text(
                result.data_json(), limit.written, limit.limit_bytes
            )
            pytest.fail(self._relative_lines(message).rstrip("\n"), pytrace=False)
        return True

    def _relative_lines(self, text: str) -> str:
        """Paths under pytest's rootdir shown from it, as the limit failures show them."""
        return text.replace(self._root, "")

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when != "call":
            return
        measurements = self._pending.pop(report.nodeid, None)
        if measurements is None:
            return
        outcome = _outcome(report)
        self.records.append((report.nodeid, outcome, measurements))
        if self._save_path is not None:
            devices = [m["device"] for m in measurements if m["limit_bytes"] is not None]
            meta = results.run_meta((devices or ["cpu"])[0], test=report.nodeid)
            result = PytestMemoryResult(report.nodeid, outcome, measurements, meta)
            result.save(os.path.join(self._save_path, file_name(report.nodeid)))
            self._saved += 1

    def session_sources(self) -> dict[str, Any]:
        """The allocator readers of ``--memlab``: the CPU source and each CUDA device's,
        started at the first test and held to the end of the session (counting CUDA
        devices does not initialise CUDA; a device's figures read 0 until torch does)."""
        if self._sources is None:
            sources = {"cpu": _core.monitor.Source("cpu")}
            for index in range(torch.cuda.device_count()):
                sources[f"cuda:{index}"] = _core.monitor.Source(f"cuda:{index}")
            self._sources = sources
        return self._sources

    # -- the end -------------------------------------------------------------------------
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.save_dir is not None:
            terminalreporter.write_line(
                f"memlab_rs: saved {self._saved} test result(s) in {self.save_dir}"
            )
        if not self.table:
            return
        terminalreporter.write_sep("=", "memlab_rs: the highest peaks of the tests' calls")
        by_device: dict[str, list[dict[str, Any]]] = {}
        for nodeid, outcome, measurements in self.records:
            for m in measurements:
                by_device.setdefault(m["device"], []).append(
                    {"nodeid": nodeid, "peak_bytes": m["peak_bytes"],
                     "limit_bytes": m["limit_bytes"], "outcome": outcome}  # fmt: skip
                )
        for device in sorted(by_device, key=_device_order):
            peaks = sorted(by_device[device], key=lambda p: (-p["peak_bytes"], p["nodeid"]))
            terminalreporter.write(
                _core.test_memory.top_table(device, json.dumps(peaks[: self.top]), len(peaks))
            )
        if not by_device:
            terminalreporter.write_line("no test's call was measured")
        terminalreporter.write_line(
            "peak: the highest allocated bytes during the call minus those allocated when it "
            "began (CPU: torch's CPU tensors; CUDA: the caching allocator's allocated bytes)"
        )

    def pytest_unconfigure(self) -> None:
        self._sources = None  # the CPU source stops with its last reader


class _Call:
    """One test call being measured: the allocator readers and, for each limit, a tracer.
    Started by the constructor (the test fails without running if a limit cannot be
    checked here), ended by ``stop``."""

    def __init__(self, plugin: MemlabPlugin, nodeid: str, limits: list[Limit]):
        self.root = plugin._root
        self.limit_of: dict[str, Limit] = {}
        for limit in limits:
            self.limit_of[self._device(nodeid, limit)] = limit
        self.markers = {device: limit.written for device, limit in self.limit_of.items()}
        if plugin.every:
            self.sources = dict(plugin.session_sources())
            self.own: dict[str, Any] = {}
        else:
            self.sources = {d: _core.monitor.Source(d) for d in self.limit_of}
            self.own = self.sources
        for device in self.limit_of:
            if device not in self.sources:  # not seen by device_count(): cannot happen
                self.sources[device] = self.own[device] = _core.monitor.Source(device)
        self.notices: dict[str, list[str]] = {d: [] for d in self.sources}
        self.tracers: dict[str, Tracer] = {}
        try:
            for device in self.limit_of:
                try:
                    # Full paths: the table shows them relative to pytest's rootdir itself.
                    self.tracers[device] = Tracer(device=device, paths="full").start()
                except RuntimeError as error:  # the CPU trace needs the allocator hook
                    self.notices[device].append(f"no lines at the peak: {error}")
        except BaseException:
            for tracer in self.tracers.values():
                tracer.stop()
            raise
        # Read last: whatever starting the tracers allocated is not the test's. Each read
        # resets that device's peak, so the next one is the call's.
        self.start = {device: source.read()[0] for device, source in self.sources.items()}

    @staticmethod
    def _device(nodeid: str, limit: Limit) -> str:
        if limit.device == "cpu":
            return "cpu"
        if not torch.cuda.is_available():
            pytest.fail(
                f"memlab_rs: {nodeid} has @pytest.mark.{limit.written}, but torch sees no CUDA "
                "device here, so the limit cannot be checked; skip it where there is no GPU: "
                "@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')",
                pytrace=False,
            )
        device = "cuda" if limit.device is None else limit.device
        key = device_key(device, "device")
        try:
            cuda_index_exists(int(key[5:]), f"@pytest.mark.{limit.written}")
        except ValueError as error:
            pytest.fail(f"memlab_rs: {nodeid}: {error}", pytrace=False)
        return key

    def stop(self) -> list[dict[str, Any]]:
        """The measurements, one per device that had memory or a limit (the CPU always)."""
        try:
            return self._measurements()
        finally:
            self.own.clear()  # a source of this call alone stops here (the CPU hook comes out)

    def _measurements(self) -> list[dict[str, Any]]:
        ends = {device: source.read() for device, source in self.sources.items()}
        traces = {}
        for device, tracer in self.tracers.items():
            try:
                traces[device] = tracer.stop()
            except RuntimeError as error:
                self.notices[device].append(f"no lines at the peak: {error}")
        measurements = []
        for device, source in self.sources.items():
            start = self.start[device]
            allocated, peak = ends[device][0], ends[device][1]
            limit = self.limit_of.get(device)
            if device != "cpu" and limit is None and peak == 0 and start == 0:
                continue  # a CUDA device nothing was allocated on
            notices = self.notices[device]
            notice = source.notice()
            if notice:
                notices.append(notice)
            if peak < start:
                notices.append(
                    "the allocator's peak was reset during the call (by the test, or a "
                    "profiler it ran): the peak is the one since that reset"
                )
            rows: list[dict[str, Any]] = []
            trace = traces.get(device)
            if trace is not None and device in trace.devices:  # else: nothing allocated
                rows = [
                    {"location": self._relative(r.location), "bytes": r.bytes, "count": r.count}
                    for r in trace.rows(device)
                    if r.location != "untraced"
                ][:SAVED_ROWS]
                notices += trace.notices(device)
            measurements.append(
                {
                    "device": device,
                    "peak_bytes": max(peak, allocated, start) - start,
                    "start_bytes": start,
                    "limit_bytes": None if limit is None else limit.limit_bytes,
                    "rows": rows,
                    "notices": notices,
                }
            )
        return measurements

    def _relative(self, location: str) -> str:
        return location[len(self.root) :] if location.startswith(self.root) else location
