"""``oom_guard``: a post-mortem written at the moment memory runs out.

When a CUDA allocation fails, torch's caching allocator calls its out-of-memory observers
(``torch._C._cuda_attach_out_of_memory_observer``) after releasing its lock and before the
exception is raised, on the failing thread: the failing Python frames, every live tensor and
the allocator's segments are all still there. The guard gathers the facts then
(``facts``), Rust analyses them (``_core.doctor``), the post-mortem is saved and its summary
printed on stderr, and the error goes on unchanged. Where torch has no observer, and for
torch's CPU allocator (which raises a RuntimeError naming the bytes), the guard explains the
error as it leaves the guarded code (``__exit__``, or the process's excepthook after
``install()``), when the traceback still holds the failing frames.

torch offers no way to detach an observer, so the guard attaches one once per process; it
does nothing while no guard is active (it runs only on an out-of-memory error, so it costs
nothing otherwise).

It never makes things worse: nothing is allocated on the failing device (the gatherers read
metadata and the allocator's figures); host memory and time are bounded (``facts``' limits;
the estimate of a batch that fits runs only when asked); an error inside the guard, a second
out-of-memory error included, is caught and reported in one line; the original exception
reaches the caller unchanged.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from .. import _args, _torch, results
from .._interrupts import reraise_interrupt
from . import facts
from .result import PostMortemResult

F = TypeVar("F", bound=Callable[..., Any])

#: The guards now active, innermost last; the observer serves the innermost.
_ACTIVE: list[OOMGuard] = []
_OBSERVER_ATTACHED = False
#: Queued to attach when torch initialises CUDA (the guard started before CUDA's first use).
_OBSERVER_QUEUED = False
#: Set while a post-mortem is being written: a second OOM inside it is left alone.
_BUSY = threading.local()


def _say(text: str) -> None:
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except Exception:  # a closed stderr must not turn into a new error
        pass


def _observer(device: int, alloc: int, total: int, free: int) -> None:
    """torch's out-of-memory observer: runs inside the failing allocation. It must never
    raise (an exception here would replace the user's error)."""
    if not _ACTIVE or getattr(_BUSY, "on", False):
        return
    _BUSY.on = True
    try:
        _ACTIVE[-1]._cuda_oom(int(device), int(alloc), int(total), int(free), sys._getframe(1))
    except BaseException as e:  # noqa: BLE001 - never let our failure replace the OOM
        _say(f"memlab_rs: the out-of-memory post-mortem failed: {type(e).__name__}: {e}\n")
    finally:
        _BUSY.on = False


def observer_supported() -> bool:
    """Whether this torch lets the guard see a CUDA OOM at the failing allocation."""
    return hasattr(torch._C, "_cuda_attach_out_of_memory_observer")


def _attach_observer() -> None:
    """Attach the observer once per process, without initialising CUDA: torch's binding
    initialises CUDA before it attaches (older ones attach to no allocator at all when CUDA
    is not initialised yet), so before CUDA's first use it is queued to run when torch
    initialises CUDA (`torch.cuda._lazy_call`, as torch queues its own seeding)."""
    global _OBSERVER_QUEUED
    if _OBSERVER_ATTACHED or _OBSERVER_QUEUED or not observer_supported():
        return
    if torch.cuda.is_initialized():
        _attach_now()
        return
    lazy_call = getattr(torch.cuda, "_lazy_call", None)
    if lazy_call is None:  # no queue: attaching now would initialise CUDA; the exception path stays
        return
    _OBSERVER_QUEUED = True
    lazy_call(_attach_now)


def _attach_now() -> None:
    """Attach the observer (CUDA is initialised, or being initialised by torch)."""
    global _OBSERVER_ATTACHED
    if not _OBSERVER_ATTACHED:
        torch._C._cuda_attach_out_of_memory_observer(_observer)  # type: ignore[attr-defined]
        _OBSERVER_ATTACHED = True


class OOMGuard:
    """Explain an out-of-memory error where it happens: a context manager, a decorator,
    and (``install()``/``uninstall()``) a guard of the whole process.

    ``dir``: where post-mortems go (default: ``$MEMLAB_RS_OOM_DIR`` or the working
    directory), one file per error, named by host, process and rank. ``model`` and
    ``optimizer`` name the tensors (a module, an optimizer, or a dict of them by name;
    models and optimizers the failing frames hold are found too). ``history``: keep a
    bounded allocation history (True, or its number of entries) so the post-mortem shows
    the live set by source line and by module, and a memory_viz snapshot is written beside
    it; it costs what torch's own history recording costs. ``make_inputs(batch)`` and
    ``batch_size``: with them and ``model``, the post-mortem names the largest batch that
    fits (the estimate; also ``loss_fn``, ``make_targets``). ``summary``: print the summary
    on stderr.

    The error always propagates unchanged; ``last`` is the last post-mortem and ``path``
    its file.
    """

    def __init__(
        self,
        dir: str | os.PathLike[str] | None = None,
        *,
        model: Any = None,
        optimizer: Any = None,
        history: bool | int = False,
        make_inputs: Callable[[int], Any] | None = None,
        batch_size: int | None = None,
        loss_fn: Callable[..., torch.Tensor] | None = None,
        make_targets: Callable[[int], Any] | None = None,
        summary: bool = True,
    ):
        self.dir = _args.optional_path(dir, "dir") or os.environ.get("MEMLAB_RS_OOM_DIR") or "."
        self._models = _named(model, torch.nn.Module, "model")
        self._optimizers = _named(optimizer, torch.optim.Optimizer, "optimizer")
        if history is True:
            history = 100_000
        self.history = 0 if history is False else _args.count(history, "history", minimum=1)
        if make_inputs is not None:
            _args.function(make_inputs, "make_inputs", "a function of the batch size")
            if batch_size is None or not self._models:
                raise ValueError(
                    "make_inputs=... needs batch_size= (the batch that runs) and model= "
                    "(the model it feeds) to say which batch fits"
                )
        self.make_inputs = make_inputs
        self.batch_size = (
            None if batch_size is None else _args.count(batch_size, "batch_size", minimum=1)
        )
        self.loss_fn = loss_fn
        self.make_targets = make_targets
        self.summary = bool(summary)
        self.last: PostMortemResult | None = None
        self.path: Path | None = None
        self._tracer: Any = None
        self._pending: dict[str, Any] | None = None
        self._active = False

    # -- on and off -----------------------------------------------------------------------

    def start(self) -> OOMGuard:
        if self._active:
            raise RuntimeError("this oom_guard is already active")
        if self.history:
            from ..trace import Tracer

            device = "cuda" if torch.cuda.is_available() else "cpu"
            model = next(iter(self._models.values()), None)
            self._tracer = Tracer(
                device, max_entries=self.history, model=model, tag_modules=model is not None
            )
            self._tracer.start()
        _attach_observer()
        _ACTIVE.append(self)
        self._active = True
        return self

    def stop(self) -> None:
        if not self._active:
            return
        self._active = False
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        self._stop_tracer()

    def _stop_tracer(self) -> Any:
        tracer, self._tracer = self._tracer, None
        if tracer is None:
            return None
        try:
            return tracer.stop()
        except RuntimeError:  # already stopped
            return None

    def __enter__(self) -> OOMGuard:
        return self.start()

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        try:
            if error is not None:
                self.explain(error, tb)
        finally:
            self.stop()

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return guarded  # type: ignore[return-value]

    # -- explaining -----------------------------------------------------------------------

    def explain(self, error: BaseException, tb: types.TracebackType | None = None) -> None:
        """Explain `error` if it is an out-of-memory error (a CUDA one the observer saw
        gets its message added; others are explained now from the traceback). Never
        raises."""
        if getattr(_BUSY, "on", False):
            return
        _BUSY.on = True
        try:
            self._explain(error, tb or error.__traceback__)
        except BaseException as e:  # noqa: BLE001 - the user's error goes on unchanged
            _say(f"memlab_rs: the out-of-memory post-mortem failed: {type(e).__name__}: {e}\n")
        finally:
            _BUSY.on = False

    def _explain(self, error: BaseException, tb: types.TracebackType | None) -> None:
        if facts.is_cuda_oom(error):
            pending, self._pending = self._pending, None
            if pending is not None:  # the observer wrote it: add what only the error knows
                pending["error"] = facts.first_line(error)
                # The observer knows the segment the allocator asked for; the message names
                # the request itself (to 0.5%): the verdict is replayed for it.
                asked = facts.cuda_request_from_message(str(error))
                alloc = pending["request"]["allocation_bytes"]
                if (
                    asked is not None
                    and alloc is not None
                    and asked < alloc
                    and "_state" in pending
                ):
                    pending["fragmentation"] = facts.fragmentation(
                        pending["_state"], asked, pending["request"]["stream"]
                    )
                self._add_batch(pending)
                self._finish(pending, quiet=True)
                return
            index = facts.cuda_index_of_error(error)
            frames = facts.frames_of_traceback(tb)
            found = self._gather(f"cuda:{index}", frames, source="exception")
            found["error"] = facts.first_line(error)
            found["cuda"] = facts.cuda_memory(index, None, None)
            asked = facts.cuda_request_from_message(str(error))
            stream = _torch.cuda_stream_number(None, index)
            found["request"]["stream"] = stream
            if asked is not None:
                try:
                    state = facts.allocator_state(index, found["cuda"]["driver_free"])
                    found["fragmentation"] = facts.fragmentation(state, asked, stream)
                except RuntimeError as e:  # another allocator backend
                    found["notices"].append(f"no fragmentation analysis: {e}")
            found["notices"].append(
                "seen as the error left the guarded code (this torch has no out-of-memory "
                "observer): the failing frames' locals may already be gone"
            )
            self._add_batch(found)
            self._finish(found)
        elif facts.is_cpu_oom(error):
            frames = facts.frames_of_traceback(tb)
            found = self._gather("cpu", frames, source="exception")
            found["error"] = facts.first_line(error)
            found["request"]["bytes"] = facts.cpu_request(str(error))
            found["host"] = facts.host_memory()
            self._finish(found)

    def _cuda_oom(
        self, index: int, alloc: int, total: int, free: int, frame: types.FrameType
    ) -> None:
        started = time.perf_counter()
        frames = facts.user_frames(frame)
        found = self._gather(f"cuda:{index}", frames, source="observer", started=started)
        stream = _torch.cuda_stream_number(None, index)
        found["request"]["allocation_bytes"] = alloc
        found["request"]["stream"] = stream
        found["cuda"] = facts.cuda_memory(index, total, free)
        try:
            found["_state"] = facts.allocator_state(index, free)
            found["fragmentation"] = facts.fragmentation(found["_state"], alloc, stream)
        except RuntimeError as e:  # another allocator backend: no segments to replay
            found["notices"].append(f"no fragmentation analysis: {e}")
        self._finish(found)
        self._pending = found

    def _gather(
        self, device: str, frames: list[types.FrameType], source: str, started: float | None = None
    ) -> dict[str, Any]:
        started = time.perf_counter() if started is None else started
        models, optimizers = facts.found_objects(frames, self._models, self._optimizers)
        notices: list[str] = []
        found: dict[str, Any] = {
            "device": device,
            "error": "",
            "request": {
                "bytes": None,
                "allocation_bytes": None,
                "stream": None,
                "pool": "default",
                "source": source,
            },
            "stack": facts.stack_rows(frames),
            "notices": notices,
            "history": False,
            "by_line": [],
            "by_module": [],
            "_started": started,
        }
        rank = results.rank_info()
        if rank["world_size"] > 1:
            found["rank"], found["world_size"] = rank["rank"], rank["world_size"]
        trace = self._stop_tracer()
        if trace is not None:
            found["history"] = True
            found["_trace"] = trace
            for key, rows in (
                ("by_line", trace.rows(device)),
                ("by_module", trace.module_rows(device)),
            ):
                found[key] = [
                    {"location": r.location, "bytes": int(r.bytes), "count": int(r.count)}
                    for r in rows[: facts.TENSOR_ROWS]
                ]
        # The frames' tensors, found once: named in the walk, and roots of autograd's graphs.
        frame_tensors = facts.frame_names(frames)
        found.update(facts.live_tensors(device, models, optimizers, frame_tensors))
        saved = facts.autograd_saved(torch.device(device), frame_tensors, models, optimizers)
        if saved is not None:
            found["autograd"] = saved
        found["_models"] = models
        found["_optimizers"] = optimizers
        return found

    def _add_batch(self, found: dict[str, Any]) -> None:
        """The largest batch whose estimated step fits what torch could have had: the
        device's total less what was used outside torch's allocator. An estimate that
        fails is a notice: the rest of the post-mortem stands."""
        if self.make_inputs is None or self.batch_size is None or found.get("cuda") is None:
            return
        try:
            self._estimate_batch(found)
        except Exception as e:  # noqa: BLE001 - say why, keep the post-mortem
            reraise_interrupt(e)
            found["notices"].append(
                f"the batch that fits could not be estimated: {type(e).__name__}: {e}"
            )

    def _estimate_batch(self, found: dict[str, Any]) -> None:
        make_inputs, batch = self.make_inputs, self.batch_size
        assert make_inputs is not None and batch is not None  # _add_batch checked
        from ..estimation import max_batch_size

        cuda = found["cuda"]
        budget = cuda["reserved"] + cuda["driver_free"]
        model = next(iter(self._models.values()))
        opt = next(iter(found["_optimizers"].values()), None)
        kwargs: dict[str, Any] = {}
        if opt is not None:
            kwargs["optimizer"] = opt  # the same class and param groups on the fake copy
        fits = max_batch_size(
            model,
            make_inputs,
            budget,
            make_targets=self.make_targets,
            loss_fn=self.loss_fn,
            device=found["device"],
            limit=batch,
            **kwargs,
        )
        from ..estimation import estimate

        peak = 0
        if fits:
            inputs = make_inputs(fits)
            report = estimate(
                model,
                inputs,
                device=found["device"],
                loss_fn=self.loss_fn,
                targets=None if self.make_targets is None else self.make_targets(fits),
                **kwargs,
            )
            peak = int(report.peak_reserved)
        found["batch"] = {
            "current": batch,
            "fits": fits,
            "peak_at_fit": peak,
            "budget": budget,
        }

    def _finish(self, found: dict[str, Any], quiet: bool = False) -> None:
        plain = {k: v for k, v in found.items() if not k.startswith("_")}
        plain["seconds"] = time.perf_counter() - found["_started"]
        meta = results.run_meta(found["device"], postmortem=True)
        pm = PostMortemResult._from_facts(json.dumps(plain), meta)
        path = self.path if quiet and self.path is not None else self._new_path(found)
        pm.save(path)
        trace = found.get("_trace")
        if trace is not None and not quiet:  # written once, with the first post-mortem
            viz = path.with_name(path.name.replace(".json", ".memory_viz.pickle"))
            trace.export_memory_viz(viz)
        self.last, self.path = pm, path
        if self.summary and not quiet:
            _say(pm.summary() + f"  post-mortem: {path}\n")

    def _new_path(self, found: dict[str, Any]) -> Path:
        folder = Path(self.dir)
        folder.mkdir(parents=True, exist_ok=True)
        rank = f"_rank{found['rank']}" if "rank" in found else ""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = f"memlab_oom_{socket.gethostname()}_{os.getpid()}{rank}_{stamp}"
        path = folder / f"{name}.json"
        n = 1
        while path.exists():
            n += 1
            path = folder / f"{name}_{n}.json"
        return path


def _named(value: Any, kind: type, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, kind):
        return {"": value}  # given alone: named as the tensor report names it
    if isinstance(value, dict) and all(isinstance(v, kind) for v in value.values()):
        return {str(k): v for k, v in value.items()}
    raise TypeError(
        f"{name}={_args.shown(value)}: pass a {kind.__module__}.{kind.__name__} or a dict of "
        f"them by name"
    )


# -- the whole process --------------------------------------------------------------------

_INSTALLED: dict[str, Any] = {}


def install(**options: Any) -> OOMGuard:
    """Guard the whole process: every out-of-memory error is explained (caught ones too,
    for CUDA; uncaught ones through ``sys.excepthook`` and ``threading.excepthook``) until
    ``uninstall()``. Returns the guard."""
    if _INSTALLED:
        raise RuntimeError("oom_guard is already installed: uninstall() first")
    guard = OOMGuard(**options).start()
    previous_hook, previous_thread_hook = sys.excepthook, threading.excepthook

    def hook(kind: Any, error: BaseException, tb: Any) -> None:
        guard.explain(error, tb)
        previous_hook(kind, error, tb)

    def thread_hook(args: Any) -> None:
        if args.exc_value is not None:
            guard.explain(args.exc_value, args.exc_traceback)
        previous_thread_hook(args)

    sys.excepthook, threading.excepthook = hook, thread_hook
    _INSTALLED.update(
        guard=guard,
        hook=hook,
        thread_hook=thread_hook,
        previous=previous_hook,
        previous_thread=previous_thread_hook,
    )
    return guard


def uninstall() -> None:
    """Undo ``install()``: the hooks it set are put back (if nobody replaced them since)."""
    if not _INSTALLED:
        return
    if sys.excepthook is _INSTALLED["hook"]:
        sys.excepthook = _INSTALLED["previous"]
    if threading.excepthook is _INSTALLED["thread_hook"]:
        threading.excepthook = _INSTALLED["previous_thread"]
    _INSTALLED["guard"].stop()
    _INSTALLED.clear()


class _OOMGuardFront:
    """``memlab_rs.oom_guard``: ``with oom_guard(): ...``, ``@oom_guard``,
    ``@oom_guard(dir=...)``, and ``oom_guard.install()``/``oom_guard.uninstall()`` for the
    whole process. The options are ``OOMGuard``'s.

    >>> import memlab_rs
    >>> with memlab_rs.oom_guard(summary=False) as guard:
    ...     pass
    >>> guard.last is None
    True
    """

    install = staticmethod(install)
    uninstall = staticmethod(uninstall)

    def __call__(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
        if fn is not None:
            return OOMGuard(**options)(fn)
        return OOMGuard(**options)

    def __repr__(self) -> str:
        return "<memlab_rs.oom_guard>"


oom_guard = _OOMGuardFront()
