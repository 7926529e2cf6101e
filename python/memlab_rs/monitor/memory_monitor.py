"""A per-iteration training monitor: ``memory_profiler(model, print_period, csv)``.

The original tool (a small research profiler) prints, every ``print_period`` iterations,
a block of peak/current cached memory, feature maps, weights, weight gradients and
intermediate gradients, and writes one CSV row per printed iteration. This one prints the
same block line for line and makes every number exact (definitions in docs/guide.md).

How it measures (one iteration = from one ``record_stats()`` to the next):

- The allocator (``_core.monitor.Source``: CUDA's caching allocator, or the CPU source) is
  sampled at each boundary, and its peaks are reset there, so each window between two
  boundaries has an exact peak. Boundaries: ``record_stats()``, each backward start and
  each backward end (``torch.autograd.backward``/``grad`` wrapped: ``_backward_calls``).
- Saved activations: a ``saved_tensors_hooks`` pair (``_core.monitor.SavedTensorHooks``, in
  Rust: torch calls it for every saved tensor), pushed as the default hooks on the training
  thread for the iterations the monitor *measures*. Pack wraps what autograd must hold (a
  leaf as is, anything else as ``t.detach()``: returning ``t`` itself would make a
  reference cycle through ``t.grad_fn``) in an object only autograd holds, and logs it
  weakly, so "saved storages alive" is read exactly at any boundary
  (``src/monitor/py/saved.rs``). A pair on top of the stack when ours is pushed
  (``save_on_cpu`` around the whole loop, say) is chained: its pack runs first, and what it
  returns is what autograd holds.
- Which iterations are measured (``feature_maps="auto"``): torch's hook mechanism costs
  several microseconds per saved tensor, 10 to 15% of a CPU-bound step, so the pair is on
  only while the step changes. An iteration's *signature* is everything the monitor reads
  without the hooks: each window's kind, allocator peak, allocated bytes and known
  categories at its boundaries, the allocator's allocation/free counts, live blocks and
  requested bytes, and each forward call of the model's inputs (shapes, dtypes, devices,
  scalars), training flag, grad and autocast modes. The first iterations are measured until
  two in a row have the same signature; later ones run without hooks, and one whose
  signature equals the last measured iteration's takes its saved-tensor figures
  (``feature_maps_from`` names that step). A forward call whose inputs differ from the
  measured iteration's turns the hooks on at once; any other difference leaves that
  iteration's feature maps unmeasured (``n/a``, said in its notice) and measures the next.
  ``feature_maps="every"`` keeps the hooks on throughout.
- Intermediate gradients: in a measured iteration, each backward's start puts a post-hook
  on every node of its graph (``_core.monitor.GradientLog``, ``src/monitor/py/gradients.rs``)
  and its end takes them off: a node's hook samples the gradients it received and returned
  and those waiting in later nodes' input buffers (known from the graph's edges, each
  storage by its base address; no storage object is made, which would stop torch summing
  gradients in place and change what a measured iteration allocates); those that go to a
  leaf's ``AccumulateGrad`` are left out.
- At each boundary the known tensors are read in one Rust call each
  (``_core.monitor.Tensors``, ``src/monitor/py/live.rs``): parameter gradients and live saved
  storages; parameters and buffers (their storages cached and re-validated by data pointer
  at each record) and optimizer state (cached while its tensors are the same objects) are
  handed to it when they change. Each storage once, on the monitored device only.
- At each record the iteration's figures go to the record (``_core.monitor.Recorder``,
  ``src/monitor/record.rs``) once, as JSON: the Rust analysis (``src/monitor/analyse.rs``)
  turns the windows into categories at the peak, and the block is printed from the record.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import weakref
from datetime import datetime
from typing import Any, NamedTuple, TextIO

import torch

from .. import _core, _module_hooks, results
from . import _backward_calls, _hook_stack, _model
from .result import MonitorResult, dataframe, rendered

_rust = _core.monitor


class _DeadFlag:
    """Raised by a weak reference's callback when a cached optimizer-state tensor dies. It
    holds no reference to the monitor, so the references' callbacks make no cycle."""

    __slots__ = ("raised",)

    def __init__(self) -> None:
        self.raised = False

    def raise_(self, _ref: object) -> None:
        self.raised = True


class MemoryMonitor:
    """Monitor a training loop's memory per iteration, as the original ``memory_profiler``
    (``memlab_rs.memory_profiler`` is this class): call ``record_stats()`` after each step
    and ``epoch_end()`` after each epoch; every ``print_period`` iterations the block is
    printed (to ``file``, default stdout) and, with ``csv=True``, a row is appended to
    ``<csv_dir>/<YYYYmmddHHMMSS>.csv``.

    ``optimizer`` adds its state; ``device`` defaults to the model's; ``verbose`` adds
    feature maps per module. ``feature_maps="auto"`` measures saved tensors only while the
    step changes and reuses the figures of an identical measured step (module docstring,
    docs/guide.md); ``"every"`` measures every iteration, at several microseconds per saved
    tensor. Call ``stop()`` (or use ``with``) to remove the hooks. The monitor resets the
    allocator's peak statistics at each boundary (docs/guide.md).

    >>> import io, torch, memlab_rs
    >>> model = torch.nn.Linear(1000, 500)
    >>> with memlab_rs.memory_profiler(model, file=io.StringIO()) as monitor:
    ...     model(torch.randn(8, 1000, requires_grad=True)).sum().backward()
    ...     monitor.record_stats()
    >>> monitor.rows()[0]["weight_usage"]
    2002000
    """

    def __init__(
        self,
        model: torch.nn.Module,
        print_period: int = 1,
        csv: bool = False,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        device: torch.device | str | int | None = None,
        verbose: bool = False,
        csv_dir: str | os.PathLike[str] = "memory_csv_data",
        file: TextIO | None = None,
        feature_maps: str = "auto",
    ) -> None:
        _model.check_arguments(model, print_period, csv, optimizer, verbose, csv_dir, file)
        if feature_maps not in ("auto", "every"):
            raise ValueError(
                f"memory_profiler: feature_maps must be 'auto' (measure saved tensors while "
                f"the step changes) or 'every' (every iteration), got {feature_maps!r}"
            )
        self._every = feature_maps == "every"
        self._model: Any = model
        self._optimizer: Any = optimizer
        self._print_period = int(print_period)
        self._verbose = verbose
        self._file = file
        self._device = _model.monitored_device(model, device)
        self._device_index = -1 if self._device == "cpu" else int(self._device[5:])
        self._device_type = "cpu" if self._device == "cpu" else "cuda"
        self.iteration = 0
        self.epoch = 1
        self._last_unmeasured = False  # the last iteration recorded took no feature maps
        self._stopped = False
        self._thread = threading.get_ident()
        self._lock = threading.RLock()
        self._param_key: list[int] | None = None
        self._rows: list[tuple[str, list[torch.nn.Parameter], int]] = []
        self._row_bytes: list[int] = []
        self._no_grads: list[int] = []
        self._param_bytes = 0
        self._param_ptrs: set[int] = set()
        self._tensors: Any = _rust.Tensors(self._device_index)
        self._buffer_bytes = 0
        self._buffer_ptrs: set[int] = set()
        self._buffer_key: list[int] | None = None
        self._opt_ids: list[int] | None = None
        self._opt_quick: tuple[int, int] | None = None
        # The cached state's tensors, weakly: a dead one sets the flag (an id compared
        # later could be a new tensor's at the dead one's address).
        self._opt_refs: list[weakref.ref] = []
        self._opt_dead = _DeadFlag()
        self._params: list[torch.Tensor] | None = None
        self._buffers: list[torch.Tensor] = []
        self._opt_state: dict[int, int] = {}
        self._row_grads: list[int] = []
        self._module_stack: list[str] = []
        self._handles: list[Any] = []
        self._hooks: Any = None
        self._pack: Any = None
        self._unpack: Any = None
        # Our pair is on a hook stack (of thread ``_pushed_on``) while iterations are
        # measured; ``_chained_now``: a pair under it was chained during this iteration.
        self._pushed_on: int | None = None
        self._chains = False  # the pair pushed chains another
        self._measured = False  # the hooks were on for the whole of this iteration
        self._chained_now = False
        self._top_at_start: Any = None
        self._calibration: _Calibration | None = None
        self._keys: list[Any] = []
        self._counts: list[list[int]] = []
        self._start: list[int] = []
        self._windows: list[tuple[str, list[int], list[int], int]] = []
        self._phase = "forward"
        self._feature_maps: int | None = None
        self._modules: list[tuple[str, int]] = []
        self._peak_reserved = 0
        self._backwards = 0
        self._grads: list[int] = []  # per row, at the last backward end
        # Intermediate gradients: the watch of the backward running (measured iterations
        # only), the most seen in this iteration's backwards, and the figure recorded.
        self._grad_log: Any = None
        self._grad_handles: list[Any] = []
        self._intermediate = 0
        self._intermediate_incomplete = False
        self._intermediate_figure: int | None = None
        self._source: Any = _rust.Source(self._device)
        # The record every rendering reads (text, CSV, plots), in Rust: ``result()`` is its
        # data, so a loaded result renders as this monitor printed.
        head = {
            "device": self._device,
            "verbose": verbose,
            "print_period": self._print_period,
            "csv_names": [name for name, _ps, _n in _model.param_rows(model)],
        }
        self._recorder: Any = _rust.Recorder(json.dumps(head))
        self._csv_path: str | None = None
        if csv:
            self._csv_path = self._open_csv(os.fspath(csv_dir))
        stack = self._module_stack if self._verbose else None
        self._hooks = _rust.SavedTensorHooks(torch.Tensor, stack)
        # Bound once: the pair on top of the stack is recognised as ours by identity.
        self._pack, self._unpack = self._hooks.pack, self._hooks.unpack
        if verbose:
            self._install_module_hooks()
        if not self._every:
            # A hook of ours: left out of the model's state (deepcopy, pickle, torch.save).
            handle = _module_hooks.register_forward_pre_hook(
                model, self._on_forward, with_kwargs=True
            )
            self._handles.append(handle)
        _backward_calls.add(self)
        self._refresh_model_tensors()
        self._new_iteration(self._boundary(self._source.read()[0]))

    # ----- public API -------------------------------------------------------------------

    def record_stats(self) -> None:
        """End the iteration: read the allocator, categorise its peak, and every
        ``print_period`` iterations print the block (and append a CSV row)."""
        with self._lock:
            self._check_running("record_stats")
            allocated, peak, reserved, peak_reserved, counts = self._source.read()
            self._refresh_model_tensors()
            end = self._boundary(allocated, full=True, complete=self._phase != "after")
            self._peak_reserved = max(self._peak_reserved, peak_reserved)
            kind = "optimizer" if self._phase == "after" else "forward"
            self._windows.append((kind, self._start, end, peak))
            self._counts.append(counts)
            if self._feature_maps is None:  # no backward: the end of forward is now
                self._feature_maps = end[5]
                self._modules = self._module_activations()
            self.iteration += 1
            source = self._settle_activations()
            self._finish(end, reserved, source)
            self._new_iteration(end)
            if self.iteration % self._print_period == 0:
                print("\n" + self.text(), file=self._file or sys.stdout)
                if self._csv_path is not None:
                    self._write_csv_row()

    def epoch_end(self) -> None:
        """Start the next epoch: iterations count from 1 again (as the original)."""
        self._check_running("epoch_end")
        print(f"Epoch {self.epoch} finished", file=self._file or sys.stdout)
        self.iteration = 0
        self.epoch += 1

    def stop(self) -> None:
        """Remove everything the monitor installed: its saved-tensor hooks (popped if they
        are on top of this thread's stack, else made inert pass-throughs), the module hooks,
        the backward wrappers (``_backward_calls``), the CPU counting. The records stay.
        Calling it twice is harmless."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            if not self._pop_hooks() and self._pushed_on is not None:
                # Left on: inert (it only chains) until it surfaces, and is popped then.
                _hook_stack.left_inert(self._pushed_on, self._pack, self._unpack)
            _backward_calls.remove(self)
            for handle in self._grad_handles:
                handle.remove()
            if self._grad_log is not None:
                self._grad_log.close()
            self._grad_log, self._grad_handles = None, []
            for handle in self._handles:
                handle.remove()
            self._handles = []
            self._hooks.stop()
            self._source = None
            # Hold no tensor of the user's once stopped (the records are plain numbers).
            self._rows = []
            self._model = self._optimizer = None
            self._params, self._buffers = [], []
            self._tensors = None
            if self._pushed_on is None:
                self._pack = self._unpack = self._hooks = None

    def __enter__(self) -> MemoryMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def result(self) -> MonitorResult:
        """The record so far as data (later iterations leave it as it is): it renders as
        this monitor does, and saves as a ``monitor`` result file (``save``)."""
        with self._lock:
            data = self._recorder.data()
        result: MonitorResult = MonitorResult._from_json(data, results.run_meta(self._device))
        return result

    def rows(self) -> list[dict[str, Any]]:
        """One plain dict per recorded iteration (bytes; keys in docs/guide.md)."""
        with self._lock:
            data = self._recorder.data()
        rows: list[dict[str, Any]] = json.loads(data)["rows"]
        return rows

    @property
    def records(self) -> list[dict[str, Any]]:
        """The recorded rows, as ``rows()`` gives them."""
        return self.rows()

    def to_dataframe(self) -> Any:
        """The rows as a pandas DataFrame (needs pandas)."""
        return dataframe(self.rows())

    def text(self, iteration: int | None = None) -> str:
        """The original's block for one recorded iteration: ``iteration`` is the ``step``
        of a row (1, 2, ... over the monitor's life); None means the latest."""
        with self._lock:
            return rendered(self._recorder.render, "text", "text", iteration=iteration)

    def plot_html(self) -> str:
        """Memory per iteration by category as one self-contained HTML fragment."""
        with self._lock:
            return str(self._recorder.render("html", "{}"))

    def _repr_html_(self) -> str:
        return self.plot_html()

    def plot_png(self, path: str | os.PathLike[str]) -> None:
        """Save memory per iteration by category (stacked bars, MB) as a PNG (needs
        matplotlib)."""
        self.result().plot_png(path)

    @property
    def csv_path(self) -> str | None:
        """The CSV file written (None when ``csv=False``)."""
        return self._csv_path

    @property
    def device(self) -> str:
        """The device monitored: ``"cpu"`` or ``"cuda:N"``."""
        return self._device

    # ----- hooks ------------------------------------------------------------------------

    def _start_measuring(self) -> None:
        """Push our pair on this thread's stack (chaining the pair on top, if any): saved
        tensors are logged from now on, until ``_pop_hooks``."""
        if self._pushed_on is not None:
            return
        _hook_stack.pop_inert()
        outer = _hook_stack.top()
        self._hooks.chain(outer)
        self._chains = outer is not None
        self._chained_now = self._chained_now or self._chains
        _hook_stack.push(self._pack, self._unpack)
        self._pushed_on = threading.get_ident()

    def _pop_hooks(self) -> bool:
        """Pop our pair if it is on top of this thread's stack; False if it is left on."""
        if self._pushed_on is None:
            return True
        top = _hook_stack.top()
        if (
            threading.get_ident() != self._pushed_on
            or top is None
            or top[0] is not self._pack
            or top[1] is not self._unpack
        ):
            return False  # another thread's stack, or a pair pushed over ours: left on
        _hook_stack.pop()
        self._pushed_on = None
        _hook_stack.pop_inert()
        return True

    def _install_module_hooks(self) -> None:
        stack = self._module_stack

        for name, module in self._model.named_modules():
            label = name or type(self._model).__name__

            def pre(_m: Any, _args: Any, label: str = label) -> None:
                stack.append(label)

            def post(_m: Any, _args: Any, _out: Any) -> None:
                if stack:
                    stack.pop()

            add = _module_hooks.register_forward_pre_hook(module, pre)
            end = _module_hooks.register_forward_hook(module, post, always_call=True)
            self._handles += [add, end]

    def _on_forward(self, _module: Any, args: Any, kwargs: Any) -> None:
        """The model's forward pre-hook (``feature_maps="auto"``): note the call's key, and
        turn the hooks on when the measured iteration's call at this place had another."""
        key = _model.call_key(args, kwargs, self._model.training, self._device_type)
        with self._lock:
            if self._stopped:
                return
            self._keys.append(key)
            if self._pushed_on is not None:
                return
            cal = self._calibration
            n = len(self._keys)
            if cal is not None and cal.keys[:n] == self._keys:
                return
            # Pushing over a pair the user opened since the iteration started would pop
            # theirs when their ``with`` exits: then this iteration stays unmeasured.
            if self._phase == "forward" and _hook_stack.top() == self._top_at_start:
                self._start_measuring()
                self._measured = n == 1 and self._windows == []

    def backward_start(self, roots: list[Any]) -> bool:
        """A backward pass starts from ``roots`` (``_backward_calls``): a boundary, unless
        one runs. In a measured iteration its gradients are watched (``_core.GradientLog``)."""
        with self._lock:
            if self._stopped:
                return False
            if self._phase == "backward":  # nested (reentrant checkpointing) or another
                if self._grad_log is not None:  # thread's: its gradients count too
                    self._grad_handles += self._grad_log.watch(roots)
                return False
            allocated, peak, _reserved, peak_reserved, counts = self._source.read()
            end = self._boundary(allocated)
            self._peak_reserved = max(self._peak_reserved, peak_reserved)
            self._windows.append(("forward", self._start, end, peak))
            self._counts.append(counts)
            if self._feature_maps is None:
                self._feature_maps = end[5]
                self._modules = self._module_activations()
            self._start = end
            self._phase = "backward"
            self._backwards += 1
            if self._pushed_on is not None:  # measured: hooks on the graph's nodes
                self._grad_log = _rust.GradientLog(self._device_index)
                self._grad_handles = self._grad_log.watch(roots)
            return True

    def backward_end(self) -> None:
        """The backward pass ``backward_start`` accepted has returned."""
        with self._lock:
            if self._stopped or self._phase != "backward":
                return
            allocated, peak, _reserved, peak_reserved, counts = self._source.read()
            end = self._boundary(allocated)
            self._peak_reserved = max(self._peak_reserved, peak_reserved)
            self._windows.append(("backward", self._start, end, peak))
            self._counts.append(counts)
            self._grads = self._row_grads
            self._start = end
            self._phase = "after"
            self._end_gradient_watch()

    def _end_gradient_watch(self) -> None:
        """Take our hooks off the backward's nodes; keep its intermediate gradients."""
        log, handles = self._grad_log, self._grad_handles
        self._grad_log, self._grad_handles = None, []
        for handle in handles:
            handle.remove()
        if log is not None:
            self._intermediate = max(self._intermediate, log.peak())
            self._intermediate_incomplete |= log.incomplete
            log.close()  # torch's weak references to the storages go back now

    # ----- which iterations are measured ------------------------------------------------

    def _signature(self) -> tuple[Any, ...]:
        """Everything read of this iteration without the hooks (module docstring)."""
        windows = tuple(
            (kind, tuple(start[:5]), tuple(end[:5]), peak)
            for kind, start, end, peak in self._windows
        )
        counts = tuple(tuple(c) for c in self._counts)
        return (windows, counts, tuple(self._keys))

    def _settle_activations(self) -> int | None:
        """At a record: the step whose measured figures (saved tensors, intermediate
        gradients) this iteration shows (its own when measured), or None when they are
        unknown; and whether to measure the next."""
        signature = self._signature()
        step = len(self._recorder) + 1
        if self._measured:
            activations = [self._windows[0][1][5]] + [w[2][5] for w in self._windows]
            cal = self._calibration
            stable = cal is not None and cal.signature == signature
            self._calibration = _Calibration(
                signature,
                list(self._keys),
                activations,
                self._feature_maps,
                self._modules,
                step,
                self._chained_now,
                self._intermediate,
                self._intermediate_incomplete,
            )
            self._intermediate_figure = self._intermediate
            if stable and not self._every:
                self._pop_hooks()  # left on (another thread, a pair over ours): measures on
            return step
        cal = self._calibration
        if cal is not None and cal.signature == signature:
            for i, (_kind, start, end, _peak) in enumerate(self._windows):
                start[5], end[5] = cal.activations[i], cal.activations[i + 1]
            self._feature_maps = cal.feature_maps
            self._modules = list(cal.modules)
            self._chained_now = cal.chained
            self._intermediate_figure = cal.intermediate
            self._intermediate_incomplete = cal.intermediate_incomplete
            return cal.step
        self._feature_maps = None
        self._intermediate_figure = None
        self._modules = []
        for _kind, start, end, _peak in self._windows:
            start[5] = end[5] = 0
        return None

    # ----- what is live at a boundary ---------------------------------------------------

    def _refresh_model_tensors(self) -> None:
        """Re-read parameter and buffer storages when any data pointer changed (``.to()``,
        ``.data =``). The parameter and buffer objects are listed once, at the start:
        a module attribute re-assigned to a new Parameter later is not seen."""
        if self._params is None:
            self._params = list(self._model.parameters())
            self._buffers = list(self._model.buffers())
        changed = False
        key = _rust.data_ptrs(self._params)
        if key != self._param_key:
            self._param_key = key
            self._rows = _model.param_rows(self._model)
            self._row_bytes = [nbytes for _name, _ps, nbytes in self._rows]
            names = [name for name, _ps, _b in self._rows]
            self._recorder.set_layout(json.dumps({"names": names, "bytes": self._row_bytes}))
            self._no_grads = [0] * len(self._rows)
            unique = self._storages(self._params, exclude=set())
            self._param_ptrs = set(unique)
            self._param_bytes = sum(unique.values())
            changed = True
        bkey = _rust.data_ptrs(self._buffers)
        if bkey != self._buffer_key:
            self._buffer_key = bkey
            unique = self._storages(self._buffers, exclude=self._param_ptrs)
            self._buffer_ptrs = set(unique)
            self._buffer_bytes = sum(unique.values())
            changed = True
        if changed:
            params = [(p, i) for i, (_n, ps, _b) in enumerate(self._rows) for p in ps]
            self._tensors.set_model(params, len(self._rows), self._param_ptrs, self._buffer_ptrs)

    def _storages(self, tensors: list[torch.Tensor], exclude: Any) -> dict[int, int]:
        """{storage address: bytes} of the tensors on the monitored device, each storage
        once, leaving out the addresses in ``exclude``."""
        found = (_model.storage_of(t, self._device_index) for t in tensors)
        return {f[0]: f[1] for f in found if f is not None and f[0] not in exclude}

    def _optimizer_state(self, full: bool) -> int:
        """Bytes of the optimizer's state tensors on the monitored device (parameters',
        buffers' and gradients' storages excluded), cached while the state holds the same
        tensor objects (optimizers update in place). At a record (``full``) every tensor's
        identity is checked; at backward boundaries only the state dict's identity and
        length (new state, ``load_state_dict``)."""
        if self._optimizer is None:
            return 0
        state_dict = self._optimizer.state
        quick = (id(state_dict), len(state_dict))
        if not full and quick == self._opt_quick and not self._opt_dead.raised:
            return sum(self._opt_state.values())
        self._opt_quick = quick
        ids = _rust.state_ids(state_dict)
        if ids != self._opt_ids or self._opt_dead.raised:
            values = [v for st in state_dict.values() for v in st.values()]
            self._tensors.gradients()  # the gradient storages now, to exclude them
            known = self._tensors.known_storages()
            tensors = [v for v in values if isinstance(v, torch.Tensor)]
            state = self._storages(tensors, exclude=known)
            self._opt_ids, self._opt_state = ids, state
            self._opt_dead = _DeadFlag()
            self._opt_refs = [weakref.ref(t, self._opt_dead.raise_) for t in tensors]
            self._tensors.set_state(set(state))
        return sum(self._opt_state.values())

    def _boundary(self, allocated: int, full: bool = False, complete: bool = True) -> list[int]:
        """[allocated, parameter, buffer, gradient, optimizer_state, activation] now.

        ``complete=False`` (a record after the backward ended) reads only the allocator and
        the optimizer state: the window it ends is an optimizer window, categorised at its
        start, of whose end only the optimizer state is read (``src/monitor/analyse.rs``),
        and the next iteration's first window is a forward one, categorised at its end. The
        gradient and activation slots then repeat the backward end's, unread."""
        if complete:
            gradient, self._row_grads = self._tensors.gradients()
        state = self._optimizer_state(full)
        if not complete:
            return [
                allocated,
                self._param_bytes,
                self._buffer_bytes,
                self._start[3],
                state,
                self._start[5],
            ]
        # Without the hooks the saved tensors are unknown until the record: 0 for now.
        measuring = self._pushed_on is not None
        return [
            allocated,
            self._param_bytes,
            self._buffer_bytes,
            gradient,
            state,
            self._tensors.activations(self._hooks) if measuring else 0,
        ]

    def _module_activations(self) -> list[tuple[str, int]]:
        """Live saved storages by the module that saved them first (verbose only)."""
        if not self._verbose or self._pushed_on is None:
            return []
        outside = "(outside the model's modules)"
        return self._tensors.activations_by_module(self._hooks, outside)

    # ----- iteration bookkeeping --------------------------------------------------------

    def _new_iteration(self, start: list[int]) -> None:
        """Start an iteration at ``start``; measure it when the last one was not measured,
        or was measured but not yet twice alike (``_settle_activations``)."""
        if self._every or self._calibration is None or self._last_unmeasured:
            self._start_measuring()
        self._measured = self._pushed_on is not None
        self._chained_now = self._measured and self._chains
        self._top_at_start = _hook_stack.top()
        self._keys = []
        self._counts = []
        self._start = start
        self._windows = []
        self._phase = "forward"
        self._feature_maps = None
        self._modules = []
        self._peak_reserved = 0
        self._backwards = 0
        self._grads = self._no_grads
        self._intermediate = 0
        self._intermediate_incomplete = False

    def _finish(self, end: list[int], reserved: int, measured_at: int | None) -> None:
        """Hand the iteration to the record, once: the Rust side finds its peak window,
        categorises it and writes the notice (``src/monitor/record.rs``)."""
        iteration = {
            "epoch": self.epoch,
            "iteration": self.iteration,
            "peak_cached": self._peak_reserved,
            "current_cached": reserved,
            "feature_maps": (self._feature_maps or 0) if measured_at is not None else None,
            "feature_maps_from": measured_at,
            "intermediate_gradients": self._intermediate_figure,
            "optimizer_state_usage": end[4] if self._optimizer is not None else None,
            "backward_passes": self._backwards,
            "windows": self._windows,
            "modules": self._modules,
            "grads": self._grads,
            "notices": {
                "source": self._source.notice(),
                "chained": self._chained_now,
                "gradients_incomplete": self._intermediate_incomplete,
            },
        }
        self._recorder.push(json.dumps(iteration))
        self._last_unmeasured = measured_at is None

    # ----- CSV --------------------------------------------------------------------------

    def _open_csv(self, directory: str) -> str:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, datetime.now().strftime("%Y%m%d%H%M%S") + ".csv")
        with open(path, "w") as f:
            f.write(self._recorder.render("csv", '{"header": true}'))
        print(f"Logging data in {path}", file=self._file or sys.stdout)
        return path

    def _write_csv_row(self) -> None:
        assert self._csv_path is not None
        row = self._recorder.render("csv", json.dumps({"iteration": len(self._recorder)}))
        with open(self._csv_path, "a") as f:
            f.write(row)

    def _check_running(self, what: str) -> None:
        if self._stopped:
            raise RuntimeError(f"{what}(): this monitor was stopped; create a new one")


class _Calibration(NamedTuple):
    """The last measured iteration: what an identical iteration takes from it."""

    signature: tuple[Any, ...]
    keys: list[Any]
    activations: list[int]  # saved bytes at each boundary, the start's first
    feature_maps: int | None
    modules: list[tuple[str, int]]
    step: int
    chained: bool
    intermediate: int  # intermediate gradients
    intermediate_incomplete: bool


memory_profiler = MemoryMonitor
"""The original tool's name: ``memory_profiler(model, print_period=1, csv=False)`` is a
:class:`MemoryMonitor`."""
