"""The recorder: ``Tracer`` records allocations and frees with their stacks over a region
(torch's CUDA allocation history, or memlab_rs's CPU recording) and hands the snapshot to
the analysis (``TraceResult``). What it turns on, it turns back off; a start that fails
leaves nothing behind."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .. import _args, _core, results
from .._sources import (
    cpu_source,  # noqa: F401  (the CPU recording's torch glue)
    cuda_history,
)
from .._torch import cuda_index_exists, device_key
from .names import start_names
from .options import cwd, exclude_parts, paths_choice
from .result import TraceResult

DEFAULT_MAX_ENTRIES = 1_000_000


class Tracer:
    """Record allocations and frees with their stacks over a region, then analyse them.

    ``device``: ``"cpu"``, ``"cuda"``/``"cuda:N"``/``N``, or None (CUDA when torch sees a
    GPU, else CPU). ``max_entries`` bounds the history (a ring buffer: the oldest entries
    go, and the report says so). ``model``: names modules by their path in it when tagging,
    and names what was alive at the start by tensor in the module view
    (``untraced:0.weight``, ``untraced:0.weight.grad``, ``untraced:Adam.0.weight.exp_avg``;
    optimizers are found alive); without it, the root modules found alive name them.
    ``tag_modules``: record the module and phase running each allocation (module hooks;
    ``True``: forward, backward and optimizer step; ``"forward"``: forward and optimizer
    only, cheaper; ``False``, the default: no hooks, and the module view reads the phase
    and the innermost ``forward`` from each allocation's frames instead). Module hooks cost
    nothing on a GPU-bound step but slow a CPU-bound one (GPT-2 at batch 1x64: 1.19x on top
    of the history's 1.11x); see the guide. ``exclude``: the path parts whose frames are not
    a location (None: ``default_exclude()``; one str is one part, ``[]`` shows every frame).
    ``paths``: how files are shown in the rows and stacks: ``"short"`` (the default, as the
    peak tracer shows them: an installed package's file from its package down,
    ``.../transformers/models/llama/modeling_llama.py``; a file under the working directory
    of ``start()`` relative to it, ``models/gpt.py``; any other in full) or ``"full"``.

    On CUDA the allocator's history is turned on with Python stacks for alloc events (unless
    you already had it on: then your setting is kept) and turned back off on stop; the
    allocator statistics are not reset.

    >>> import torch, memlab_rs.trace as trace
    >>> with trace.Tracer(device="cpu") as tr:
    ...     a = torch.ones(1024, 1024)
    ...     b = a * 2
    >>> tr.result.max_mem("cpu") >= 8 << 20
    True
    """

    def __init__(
        self,
        device: Any = None,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        model: torch.nn.Module | None = None,
        tag_modules: bool | str = False,
        exclude: str | Sequence[str] | None = None,
        paths: str = "short",
    ):
        max_entries = _args.count(max_entries, "max_entries", minimum=1)
        exclude = None if exclude is None else exclude_parts(exclude)
        if tag_modules not in (True, False, "forward"):
            raise ValueError(f"tag_modules={tag_modules!r}: use True, False or 'forward'")
        if model is not None and not isinstance(model, torch.nn.Module):
            got = (
                f"the class {model.__name__}"
                if isinstance(model, type)
                else f"a {type(model).__name__}"
            )
            raise TypeError(
                f"Tracer(model=...): model must be a torch.nn.Module instance or None (its "
                f"module paths name the tags), got {got} ({_args.shown(model)}); pass the model "
                "object itself, e.g. Tracer(model=net, tag_modules=True)"
            )
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        key = device_key(device)
        if key != "cpu" and not key.startswith("cuda:"):
            raise ValueError(
                f"device={device!r}: the trace records CPU or CUDA memory ('cpu', 'cuda:N')"
            )
        self.cuda = key.startswith("cuda")
        if self.cuda:
            cuda_index_exists(int(key[5:]), f"device={device!r}")
        self.device = key
        self.max_entries = max_entries
        self.model = model
        self.tag_modules = tag_modules
        # None: default_exclude() when the result is made; one str is one path part.
        self.exclude = None if exclude is None else exclude_parts(exclude)
        self.paths = paths_choice(paths)
        self.result: TraceResult | None = None
        self._running = False
        self._we_enabled = False
        self._cpu_ours = False
        self._start: dict[str, Any] = {}
        self._names: list[list[Any]] = []
        self._cwd: str | None = None
        self._tagger: Any = None

    def start(self) -> Tracer:
        """Start recording. A start that fails (another tagger installed, an interrupt)
        undoes what it did: no recording, history setting or hook of it stays behind."""
        # A KeyboardInterrupt can land between any two statements here or in stop(), so
        # whether a recording is this tracer's to turn off is settled before the call that
        # turns it on, and _turn_off() asks what is still on (safe to repeat).
        if self._running:
            raise RuntimeError("this Tracer is already recording; stop() it first")
        self._cwd = cwd()  # what short paths are relative to, wherever the result is read
        self._cpu_ours = False
        self._running = True
        try:
            if self.cuda:
                cuda_history.ensure_initialised()
                self._names = start_names(self.model, self.device)
                self._we_enabled = not cuda_history.history_enabled()
                if self._we_enabled:
                    cuda_history.enable(self.max_entries)
                self._start = cuda_history.start_layout()
            else:
                self._names = start_names(self.model, self.device)
                # A CPU trace already on is someone else's: the start refuses it, and it
                # must be left running.
                self._cpu_ours = not _core._cpu_trace_active()
                _core._cpu_trace_start(self.max_entries)
            if self.tag_modules:
                self._start_tagger()  # a tagger that fails to install removes itself
        except BaseException:
            self._turn_off()
            raise
        return self

    def _turn_off(self) -> None:
        """Turn off what ``start()`` turned on, however far it or ``stop()`` got."""
        try:
            self._remove_tagger()
        finally:
            if self.cuda:
                self._history_off()
            elif self._cpu_ours:
                if _core._cpu_trace_active():
                    _core._cpu_trace_stop()
                self._cpu_ours = False
            self._running = False

    def _remove_tagger(self) -> None:
        if self._tagger is not None:
            self._tagger.uninstall()
            self._tagger = None

    def _history_off(self) -> None:
        """Turn CUDA's history back off if this tracer turned it on."""
        if self._we_enabled:
            cuda_history.disable()
            self._we_enabled = False

    def _start_tagger(self) -> None:
        from .tags import ModuleTagger  # module hooks: loaded only when asked for

        self._tagger = ModuleTagger(self.model, backward=self.tag_modules is True)
        self._tagger.install()

    def stop(self) -> TraceResult:
        if not self._running:
            raise RuntimeError("this Tracer is not recording; start() it first")
        try:
            self._remove_tagger()
            if self.cuda:
                try:
                    snapshot = cuda_history.snapshot()
                finally:
                    self._history_off()
                snapshot["memlab_rs"] = {
                    "version": 1,
                    "source": "cuda",
                    "device": self.device,
                    "start": self._start,
                }
            else:
                snapshot = _core._cpu_trace_stop()
                self._cpu_ours = False
            self._running = False
        except BaseException:
            self._turn_off()
            raise
        # What was alive at the start, by tensor: the module view's untraced:<name> rows.
        snapshot["memlab_rs"]["start"]["names"] = self._names
        snapshot["memlab_rs"]["cwd"] = self._cwd
        self._names = []
        meta = results.run_meta(self.device)
        self.result = TraceResult(snapshot, self.exclude, meta, self.paths)
        return self.result

    def __enter__(self) -> Tracer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
