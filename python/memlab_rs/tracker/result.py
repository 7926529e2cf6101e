"""What one ``MemTracker.track()`` found, as data (kind ``tracker``): ``TrackResult`` and its
rows, ``TrackRow``. The result's data is the serde struct of ``src/tracker/result.rs``, held
as the JSON text Rust wrote; ``_core.tracker`` checks and renders it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .. import _core, results


@dataclass(frozen=True)
class TrackRow:
    """One ``+``/``-`` line: tensors of one (type, shape, dtype) that appeared or vanished."""

    sign: str
    count: int
    shape: str
    dtype: str
    #: Bytes the allocator holds for the storages that appeared (or vanished) with them,
    #: each storage once: on CUDA each rounded up to the caching allocator's 512-byte blocks,
    #: on the CPU their own bytes.
    bytes: int
    #: The storages' own bytes (``nbytes()``), each once: what the log prints, as the
    #: original counts a tensor (numel times the element size).
    storage_bytes: int
    #: ``str(type(tensor))``, e.g. ``<class 'torch.nn.parameter.Parameter'>``.
    type: str
    #: The model's names of the tensors that appeared (or vanished), when a model is given.
    names: tuple[str, ...] = ()
    #: The row as written to the log.
    line: str = ""


@dataclass(frozen=True)
class TrackResult(results.SavedResult):
    """What one ``track()`` found: the diff rows and the totals, plain data.

    ``text()`` is the block ``track()`` appended to the log (rendered from this record),
    ``html()`` a table (Jupyter shows it); ``save(path)`` writes a ``tracker`` result file
    that ``memlab_rs.load`` reads back, rendering the same.

    >>> import os, tempfile, torch, memlab_rs
    >>> tracker = memlab_rs.MemTracker(path=tempfile.mkdtemp() + "/", device="cpu")
    >>> _ = tracker.track()
    >>> x = torch.zeros(256, 1024)
    >>> result = tracker.track()
    >>> path = os.path.join(tempfile.mkdtemp(), "track.json")
    >>> result.save(path)
    >>> memlab_rs.load(path).text() == result.text()
    True
    """

    kind: ClassVar[str] = "tracker"
    # Not annotated: class attributes, not fields.
    _rust = _core.tracker
    _formats = ("text", "html")

    rows: list[TrackRow]
    #: Bytes the allocator holds for every storage on the device, each once (CUDA: in
    #: 512-byte blocks).
    total_bytes: int
    #: The own bytes of every storage on the device, each once: the log's "Total Tensor Used
    #: Memory".
    total_storage_bytes: int
    #: ``torch.cuda.memory_allocated(device)``; on CPU the same as ``total_bytes``.
    allocated_bytes: int
    #: Live tensors on the device.
    tensors: int
    #: Where ``track()`` was called: ``file line N: function``.
    where: str
    #: How the gc walk found them (``..., since the last walk`` when it resumed).
    strategy: str
    #: Why the result may miss tensors, or None.
    incomplete: str | None
    seconds: dict[str, float] = field(default_factory=dict)
    #: Whether the log lists the rows (the tracker's ``detail``).
    detail: bool = True
    #: The log's header time stamp, on the first ``track()`` only (its block starts with
    #: the header line).
    stamp: str | None = None
    #: Where and when it was made (``results.run_meta``: device, rank, versions, time).
    meta: dict[str, Any] = field(default_factory=lambda: results.run_meta(None), compare=False)

    def __post_init__(self) -> None:
        # The fields are the Python face of the data Rust holds: made from that data
        # (``_from_json``, which sets it first), or from fields a caller gave, checked by the
        # derive here.
        if "_json" not in self.__dict__:
            object.__setattr__(self, "_json", self._rust.validate(_dumps(self._fields_data())))
        object.__setattr__(self, "_data", None)

    @classmethod
    def _from_json(cls, data_json: str, meta: dict[str, Any]) -> TrackResult:
        """The result from its data's JSON text (a saved file's, or what ``track()`` made),
        checked by the derive."""
        text = cls._rust.validate(data_json)
        data = json.loads(text)
        result = cls.__new__(cls)
        object.__setattr__(result, "_json", text)
        rows = [
            TrackRow(
                sign=r["sign"],
                count=r["count"],
                shape=r["shape"],
                dtype=r["dtype"],
                bytes=r["bytes"],
                storage_bytes=r["storage_bytes"],
                type=r["type"],
                names=tuple(r["names"]),
                line=r["line"],
            )
            for r in data["rows"]
        ]
        cls.__init__(
            result,
            rows=rows,
            total_bytes=data["total_bytes"],
            total_storage_bytes=data["total_storage_bytes"],
            allocated_bytes=data["allocated_bytes"],
            tensors=data["tensors"],
            where=data["where"],
            strategy=data["strategy"],
            incomplete=data["incomplete"],
            seconds=dict(data["seconds"]),
            detail=data["detail"],
            stamp=data["stamp"],
            meta=meta,
        )
        return result

    @classmethod
    def from_data(cls, data: dict[str, Any], meta: dict[str, Any]) -> TrackResult:
        """The result from a saved file's ``data`` and ``meta``; a ValueError naming the
        field that does not fit (its serde derive, ``src/tracker/result.rs``). A file saved
        before the storages' own bytes were kept reads its ``bytes`` for both."""
        return cls._from_json(_dumps(data), meta)

    def _fields_data(self) -> dict[str, Any]:
        rows = [
            {
                "sign": r.sign,
                "count": r.count,
                "shape": r.shape,
                "dtype": r.dtype,
                "bytes": r.bytes,
                "storage_bytes": r.storage_bytes,
                "type": r.type,
                "names": list(r.names),
                "line": r.line,
            }
            for r in self.rows
        ]
        return {
            "rows": rows,
            "total_bytes": self.total_bytes,
            "total_storage_bytes": self.total_storage_bytes,
            "allocated_bytes": self.allocated_bytes,
            "tensors": self.tensors,
            "where": self.where,
            "strategy": self.strategy,
            "incomplete": self.incomplete,
            "seconds": dict(self.seconds),
            "detail": self.detail,
            "stamp": self.stamp,
        }

    @property
    def device(self) -> str | None:
        """The device tracked (``"cuda:0"``, ``"cpu"``)."""
        return self.meta.get("device")

    def text(self) -> str:
        """The log block of this ``track()``, as written to the log file (the header line
        first on the first call, the note when the result may be incomplete)."""
        return self.render("text")

    def html(self) -> str:
        """The diff as a self-contained HTML table (Jupyter shows it): each row's storage
        bytes (what the log prints) beside the allocator's bytes for them."""
        return self.render("html")

    def to_data(self) -> dict[str, Any]:
        """The result as JSON values (a saved file's ``data``)."""
        return json.loads(self._json)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


results.register(TrackResult.kind, TrackResult.from_data)
