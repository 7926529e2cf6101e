"""The leak check's result (kind ``leaks``): how many steps were warm-up and how many
measured, and per device the sites whose live bytes grew at every measured step. Saved with
``save(path)`` and read back with ``memlab_rs.load``.

>>> from memlab_rs import LeakResult
>>> result = LeakResult(1, 3, [{"device": "cpu", "outlived": 4, "notices": [], "sites": [
...     {"location": "train.py:12 (step)", "bytes_per_step": 4096.0,
...      "live_bytes": [8192, 12288, 16384], "allocations": 4}]}], meta={"device": "cpu"})
>>> print(result.text(), end="")
Leak check: 3 steps measured after 1 warm-up step
cpu (CPU tensors): 1 site grew at every one of the 3 steps
  +4,096 bytes/step  train.py:12 (step)
      live at each step's end: 8.0 KiB, 12.0 KiB, 16.0 KiB; 4 allocations alive at the end
>>> result.leaking
True
"""

from __future__ import annotations

import types
from typing import Any

from .. import _core, results

# The doctor's submodule holds several kinds: this kind's two functions under the names
# every result class reads (``validate``, ``render``).
_LEAKS = types.SimpleNamespace(
    validate=_core.doctor.leaks_validate, render=_core.doctor.leaks_render
)


class LeakResult(results.Result):
    """The leak check's result: ``warmup`` and ``steps`` (measured), and per device (a
    dict: ``device``, ``sites``: [{``location``, ``bytes_per_step``, ``live_bytes`` (at the
    end of each measured step), ``allocations`` (alive at the end)}], ``outlived`` (the
    allocations that outlived their step), ``notices``)."""

    kind = "leaks"
    _rust = _LEAKS

    def __init__(
        self,
        warmup: int,
        steps: int,
        devices: list[dict[str, Any]],
        meta: dict[str, Any],
    ):
        self._set_data({"warmup": warmup, "steps": steps, "devices": devices}, meta)

    @property
    def warmup(self) -> int:
        """The warm-up steps (recorded, not measured)."""
        return int(self.to_data()["warmup"])

    @property
    def steps(self) -> int:
        """The measured steps."""
        return int(self.to_data()["steps"])

    @property
    def devices(self) -> list[str]:
        """The devices checked, in order."""
        return [d["device"] for d in self.to_data()["devices"]]

    def sites(self, device: str | None = None) -> list[dict[str, Any]]:
        """The growing sites of ``device`` (``"cpu"``, ``"cuda:0"``; None: of every device,
        each with its ``device``), fastest first."""
        if device is not None and device not in self.devices:
            have = ", ".join(self.devices) or "none"
            raise ValueError(f"device={device!r} was not checked (checked: {have})")
        return [
            {**site, "device": d["device"]} if device is None else dict(site)
            for d in self.to_data()["devices"]
            if device is None or d["device"] == device
            for site in d["sites"]
        ]

    def notices(self, device: str) -> list[str]:
        """Why ``device``'s figures may be incomplete, or why it was not checked."""
        for d in self.to_data()["devices"]:
            if d["device"] == device:
                return list(d["notices"])
        have = ", ".join(self.devices) or "none"
        raise ValueError(f"device={device!r} was not checked (checked: {have})")

    @property
    def leaking(self) -> bool:
        """Whether any site grew at every measured step."""
        return any(d["sites"] for d in self.to_data()["devices"])

    def text(self) -> str:
        """Per device, each growing site with its bytes per step and its live bytes at the
        end of each measured step; the notices."""
        return self.render("text")


results.register(LeakResult.kind, LeakResult.from_data)
