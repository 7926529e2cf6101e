"""One test's memory, as the pytest plugin measured it: what ``--memlab-save DIR`` writes, one
file per test, and ``memlab_rs.load`` reads back (kind ``test_memory``).

A test is measured over its call (not its setup or teardown) on each device the plugin
watched: the peak (the highest allocated bytes during the call minus those allocated when
it began), the bytes allocated when it began, the marker's limit if it had one, and, for a
test with a limit, what the call allocated that was alive at the peak, by source line.

>>> from memlab_rs import PytestMemoryResult
>>> result = PytestMemoryResult(
...     "test_a.py::test_big", "passed",
...     [{"device": "cpu", "peak_bytes": 1048576, "start_bytes": 0, "limit_bytes": None,
...       "rows": [], "notices": []}],
...     meta={"device": "cpu"})
>>> print(result.text(), end="")
test_a.py::test_big: passed
cpu: peak 1,048,576 bytes (1.0 MiB) above the 0 allocated when the call began
>>> result.peak_bytes("cpu")
1048576
"""

from __future__ import annotations

from typing import Any

from .. import _core, results


class PytestMemoryResult(results.Result):
    """One test's memory: its node id, outcome (``passed``, ``failed``, ``skipped``) and one
    measurement per device (a dict: ``device``, ``peak_bytes``, ``start_bytes``,
    ``limit_bytes`` or None, ``rows``: [{``location``, ``bytes``, ``count``}], ``notices``)."""

    kind = "test_memory"
    _rust = _core.test_memory

    def __init__(
        self,
        nodeid: str,
        outcome: str,
        measurements: list[dict[str, Any]],
        meta: dict[str, Any],
    ):
        self._set_data(
            {"nodeid": nodeid, "outcome": outcome, "measurements": measurements}, meta
        )

    @property
    def nodeid(self) -> str:
        """The test's node id."""
        return str(self.to_data()["nodeid"])

    @property
    def outcome(self) -> str:
        """``passed``, ``failed`` or ``skipped``."""
        return str(self.to_data()["outcome"])

    @property
    def measurements(self) -> list[dict[str, Any]]:
        """One dict per device measured, in measurement order."""
        return list(self.to_data()["measurements"])

    @property
    def devices(self) -> list[str]:
        """The devices measured, in measurement order."""
        return [m["device"] for m in self.measurements]

    def measurement(self, device: str) -> dict[str, Any]:
        """The measurement of ``device`` (``"cpu"``, ``"cuda:0"``)."""
        for m in self.measurements:
            if m["device"] == device:
                return m
        have = ", ".join(self.devices) or "none"
        raise ValueError(f"{self.nodeid} was not measured on {device!r} (measured: {have})")

    def peak_bytes(self, device: str) -> int:
        """The call's peak on ``device``: its highest allocated bytes minus those allocated
        when it began."""
        return int(self.measurement(device)["peak_bytes"])

    def text(self) -> str:
        """The node id and outcome, then per device the peak, the limit, and the rows alive
        at the peak."""
        return self.render("text")


results.register(PytestMemoryResult.kind, PytestMemoryResult.from_data)
