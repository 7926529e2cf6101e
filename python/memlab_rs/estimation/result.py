"""The estimate as data (kind ``estimate``): what one training step needs, in bytes. Its
fields are the serde struct of ``src/estimate/result.rs``; its text (Pytorch-Memory-Utils'
``modelsize`` style) and HTML are rendered by ``_core.estimate.render``."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any, ClassVar

from .. import _args, _core, results


@dataclasses.dataclass
class MemoryEstimate(results.SavedResult):
    """What one training step needs, in bytes (exact for the modelled allocator).

    ``peak_allocated`` predicts ``torch.cuda.max_memory_allocated()`` (or the CPU source's
    peak) of the step, starting from the parameters, buffers and inputs already on the
    device; ``peak_step`` says whether the first step (which creates the optimizer state) or
    the second, steady one peaks (under DDP on CUDA the second is a bound and a third the
    floor). With ``world_size`` above 1 the figures are rank 0's. Every figure is defined
    in docs/guide.md. ``save(path)`` writes an ``estimate`` result file; ``memlab_rs.load``
    reads it back, rendering the same.

    >>> import os, tempfile, torch, memlab_rs
    >>> est = memlab_rs.estimate(torch.nn.Linear(10, 10), torch.zeros(2, 10), device="cpu")
    >>> path = os.path.join(tempfile.mkdtemp(), "estimate.json")
    >>> est.save(path)
    >>> memlab_rs.load(path) == est
    True
    """

    kind: ClassVar[str] = "estimate"
    _rust = _core.estimate  # unannotated: a class attribute, not a dataclass field
    _formats = ("text", "html")

    model: str
    device: str
    dtype: str | None
    parameters: int
    buffers: int
    inputs: int
    gradients: int
    optimizer_state: int
    activations: int
    intermediates_forward: int
    intermediates_backward: int
    peak_allocated: int
    peak_step: int
    peak_phase: str
    peak_by_category: dict[str, int]
    phase_peaks: dict[str, int]
    phase_ends: dict[str, int]
    step_peaks: dict[int, int]
    peak_reserved: int
    workspaces: int
    allocations: int
    seconds: float
    notes: list[str]
    #: The ``torch.autocast`` dtype of forward and the loss ("bfloat16", "float16"), if any.
    autocast: str | None = None
    #: Whether the loss was scaled by a GradScaler.
    grad_scaler: bool = False
    #: The ranks of data parallelism; the figures are one rank's (rank 0's).
    world_size: int = 1
    #: The data-parallel mode: "ddp", "fsdp2" or None.
    parallel: str | None = None
    #: Bytes of the collectives' buffers at the peak (DDP's gradient buckets, FSDP2's
    #: all-gather and reduce-scatter buffers), counted under ``other``.
    collective_buffers: int = 0
    #: Where and when it was made (``results.run_meta``; ``device``: the device modelled).
    meta: dict[str, Any] = dataclasses.field(
        default_factory=lambda: results.run_meta(None), compare=False, repr=False
    )

    @property
    def activations_at_peak(self) -> int:
        """Bytes autograd had saved for backward when the peak was reached."""
        return self.peak_by_category["activation"]

    def text(self) -> str:
        """The estimate in Pytorch-Memory-Utils' ``modelsize`` style (10^6-byte M).

        >>> import torch
        >>> from memlab_rs import estimate
        >>> est = estimate(torch.nn.Linear(1000, 1000), torch.zeros(8, 1000), device="cpu")
        >>> print(est.text().splitlines()[0])
        Model Linear : params: 4.004000M
        """
        return self.render("text")

    def __str__(self) -> str:
        return self.text().rstrip("\n")  # print() adds the last newline

    def html(self) -> str:
        """The estimate as a self-contained HTML table (Jupyter shows it)."""
        return self.render("html")

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready): every field and ``activations_at_peak``.

        >>> import torch
        >>> from memlab_rs import estimate
        >>> est = estimate(torch.nn.Linear(10, 10), torch.zeros(2, 10), device="cpu")
        >>> est.to_dict()["parameters"]
        440
        """
        data = self.to_data()
        data["activations_at_peak"] = self.activations_at_peak
        return data

    def to_json(self, indent: int | None = 2) -> str:
        """``to_dict()`` as JSON, ``indent`` spaces a level (None: one line)."""
        if indent is not None:
            indent = _args.count(indent, "indent", maximum=64, what="None or an int")
        return json.dumps(self.to_dict(), indent=indent)

    def to_data(self) -> dict[str, Any]:
        """The estimate as JSON values (a saved file's ``data``): every field but ``meta``,
        ``step_peaks`` keyed by the step's number as a string."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del data["meta"]
        data = copy.deepcopy(data)
        data["step_peaks"] = {str(k): v for k, v in self.step_peaks.items()}
        return data

    def data_json(self) -> str:
        """The result's data as JSON text, as a saved file holds it."""
        # From the fields (a dataclass's may change), as its Rust derive reads them.
        return str(self._rust.validate(_dumps(self.to_data())))

    def render(self, format: str = "text", **view: Any) -> str:
        """The result in ``format`` (``text``, ``html``, ...: what the kind has), with the
        view's options (``func``, ``columns``, ...) where the kind takes them."""
        if format not in self._formats:
            have = ", ".join(self._formats)
            raise ValueError(f"format={format!r}: a {self.kind} result renders as {have}")
        return str(self._rust.render(self.data_json(), format, _dumps(view)))

    @classmethod
    def from_data(cls, data: dict[str, Any], meta: dict[str, Any]) -> MemoryEstimate:
        """The estimate from a saved file's ``data`` and ``meta``, read by its Rust derive
        (``_core.estimate.validate``: a ValueError naming the field that does not fit)."""
        checked = json.loads(cls._rust.validate(_dumps(data)))
        names = [f.name for f in dataclasses.fields(cls) if f.name != "meta"]
        fields = {name: checked[name] for name in names}
        fields["seconds"] = float(fields["seconds"])
        fields["step_peaks"] = {int(k): v for k, v in fields["step_peaks"].items()}
        return cls(**fields, meta=meta)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


results.register("estimate", MemoryEstimate.from_data)
