"""Module and phase tags for the allocation history: ``"<phase>:<module path>"``.

While a :class:`ModuleTagger` is installed, every thread's current tag says which module's
forward or backward (or which optimizer's step) it is running, and each tag change goes to
the recorders: ``torch.cuda.memory._set_memory_metadata`` (CUDA history, torch 2.10+) and
``memlab_rs._core._cpu_trace_set_tag`` (the CPU recording). Both are per thread, so a tag
is always set on the thread that runs the hook.

- forward: global module forward pre/post hooks keep a per-thread stack of module calls
  (``always_call`` post hooks, so an exception leaves no stale call).
- backward: as ``torch.utils.module_tracker.ModuleTracker`` does it, the forward hooks mark
  a call's outputs (its backward starts when the autograd node that made them runs) and its
  inputs (its backward is over when the nodes that made them run). The marks are pre-hooks
  on those nodes, shared by adjacent calls (a layer's output node is the next layer's input
  node) and holding no node, so the graph is freed as soon as it is dropped. No module
  backward hooks: those rewrite the autograd graph and cost memory. A forward run during
  backward (activation checkpointing's recomputation) is tagged ``backward``. The end of a
  backward clears the tag of the thread that finishes it (on one GPU, its device thread).
- optimizer: global optimizer step pre/post hooks tag ``"optimizer:<class name>"``.

Outside any module the tag is ``"<phase>:"`` where the phase is known (inside a backward,
inside an optimizer step) and ``""`` otherwise: between the end of the outermost forward and
the first module backward (the loss and its gradient) no phase is known. The trace's module
view shows ``"<phase>:"`` as ``"<phase>:(no module)"``.

What is not covered (the tag is approximate there):
- Autograd nodes that run between modules in backward (or before the model's output gets its
  gradient) carry the innermost module whose backward has started and not ended, or
  ``"backward:"`` when there is none; the loss's own backward nodes, run before any module's,
  carry the tag the thread had (``""`` after a forward, or on a CUDA device thread the value
  left by the end of the previous backward: ``""`` where that backward ended on that thread).
- A module whose inputs need no gradient (the first layer, an embedding) or are leaf tensors
  never sees its backward end; it stays active until the whole backward is over (newer
  modules are above it, so it shows only where nothing newer is active).
- ``backward(inputs=...)`` or ``autograd.grad`` that stop before a module's inputs: the same.
- A leaf tensor (a parameter a module returns or takes as is) gets no mark: a hook on it
  would outlive the step.
- Code compiled by ``torch.compile`` carries the tag of the module that called it.
- On torch < 2.2 (no ``always_call`` forward hooks) an exception that leaves the outermost
  module leaves that thread's forward stack stale until the next outermost call returns.
- An exception inside ``optimizer.step()`` leaves that thread tagged ``optimizer:`` until
  the next step ends or the tagger is uninstalled.
- ``uninstall()`` clears the tag of the thread that calls it; a thread inside a module call
  at that moment keeps its last tag until something sets another.

Cost: one node pre-hook per module call (registered in forward, called in backward) is most
of it; ``backward=False`` leaves it out (bench/trace_tag_cost.py, bench/results/).
"""

from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils._pytree import tree_flatten

from .. import _core

Setter = Callable[[str], None]

_no_graph_task: Callable[[], int] = lambda: -1  # noqa: E731
_graph_task_id: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", _no_graph_task)
_is_compiling: Callable[[], bool] = getattr(
    getattr(torch, "compiler", None), "is_compiling", lambda: False
)

# At most one tagger is installed at a time: two would overwrite each other's tags.
_installed: ModuleTagger | None = None
_installed_lock = threading.Lock()


def cuda_tag_setter() -> Setter | None:
    """torch's per-thread allocation tag for the CUDA history, or None where torch has none,
    CUDA is not initialised (it is never initialised here) or the allocator backend does not
    record tags (``cudaMallocAsync``, a pluggable allocator).

    Example:
        >>> setter = cuda_tag_setter()
        >>> setter is None or callable(setter)
        True
    """
    memory = torch.cuda.memory
    set_metadata = getattr(memory, "_set_memory_metadata", None)
    if set_metadata is None or not torch.cuda.is_initialized():
        return None
    supported = getattr(memory, "_memory_metadata_supported", None)
    if supported is not None and not supported():
        return None
    fast = getattr(torch._C, "_cuda_setMemoryMetadata", None)
    # The public wrapper only turns a dict into JSON first; a str goes straight through.
    return fast if fast is not None else set_metadata


def cpu_tag_setter() -> Setter | None:
    """The CPU recording's per-thread allocation tag, or None in a build without it.

    Example:
        >>> setter = cpu_tag_setter()
        >>> setter is None or callable(setter)
        True
    """
    return getattr(_core, "_cpu_trace_set_tag", None)


def set_tag(tag: str) -> None:
    """Tag this thread's allocations from now on with ``tag`` (``""`` clears), for the CUDA
    history (where torch records tags and CUDA is initialised) and the CPU recording.

    An installed :class:`ModuleTagger` replaces the tag at its next module boundary.

    Example:
        >>> set_tag("data loading")
        >>> set_tag("")
    """
    if not isinstance(tag, str):
        raise TypeError(f"set_tag(tag): tag must be a str, got {type(tag).__name__}")
    for setter in (cuda_tag_setter(), cpu_tag_setter()):
        if setter is not None:
            setter(tag)
    tagger = _installed
    if tagger is not None:
        tagger._state.last = tag  # so that its next different tag replaces this one


class _Call:
    """One module call: its names (path, forward tag, backward tag), the tag it runs under,
    and the call it ran inside."""

    __slots__ = ("module_id", "names", "tag", "parent", "inputs")

    def __init__(
        self, module_id: int, names: tuple[str, str, str], tag: str, parent: _Call | None
    ) -> None:
        self.module_id = module_id
        self.names = names
        self.tag = tag
        self.parent = parent
        self.inputs = 0  # nodes of its inputs hooked: its backward ends when all have run

    def inside(self, other: _Call) -> bool:
        """Whether this call ran (directly or not) inside ``other``."""
        call = self.parent
        while call is not None:
            if call is other:
                return True
            call = call.parent
        return False


class _GraphTask:
    """One backward's module calls whose backward has started and not ended, newest last."""

    __slots__ = ("active", "started", "pending")

    def __init__(self) -> None:
        self.active: list[_Call] = []
        self.started: set[_Call] = set()  # entered once per backward, even with many outputs
        self.pending: dict[_Call, int] = {}  # input gradients a call still waits for


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.calls: list[_Call] = []  # this thread's forward stack
        self.graph_tasks: list[int] = []  # backward graph tasks seen here, innermost last
        self.optimizer = ""  # "optimizer:<name>" inside a step
        self.last: str | None = None  # the tag last given to the setters on this thread
        self.node: Any = None  # the autograd node last hooked by this thread, and its hook
        self.node_hook: _NodeHook | None = None


class _NodeHook:
    """A pre-hook on one autograd node, run when the node is about to run in backward: the
    calls whose outputs it made start their backward (``enter``), the calls whose inputs it
    made end theirs (one node serves a layer's output and the next layer's input)."""

    __slots__ = ("tagger", "actions")

    def __init__(self, tagger: ModuleTagger) -> None:
        self.tagger = tagger
        self.actions: list[Any] = []  # call, enter, call, enter, ... in forward order

    def __call__(self, grad_outputs: Any) -> None:
        self.tagger._backward_step(self.actions)


def _grad_tensors(value: Any) -> list[torch.Tensor]:
    """The non-leaf tensors in ``value`` that take part in autograd (leaves are skipped: a
    hook on a parameter would outlive the step and pile up, one per call)."""
    Tensor = torch.Tensor
    if isinstance(value, Tensor):
        return [value] if value.requires_grad and not value.is_leaf else []
    if type(value) is tuple:  # a call's args: walk one level, the common case
        found = []
        for item in value:
            if isinstance(item, Tensor):
                if item.requires_grad and not item.is_leaf:
                    found.append(item)
            elif isinstance(item, (tuple, list, dict)):
                break
        else:
            return found
    items = tree_flatten(value)[0]
    return [v for v in items if isinstance(v, Tensor) and v.requires_grad and not v.is_leaf]


def _handle_alive(handle: Any) -> bool:
    """Whether a hook handle's hooks still exist (they go with their autograd node)."""
    ref = getattr(handle, "hooks_dict_ref", None)
    return ref is None or ref() is not None


def _forward_hook_always_call() -> bool:
    try:
        return "always_call" in inspect.signature(register_module_forward_hook).parameters
    except (TypeError, ValueError):
        return False


class ModuleTagger:
    """Tags every allocation with ``"<phase>:<module path>"`` while installed.

    ``model``: module paths come from ``model.named_modules()`` (``"transformer.h.3.attn"``;
    the model itself is ``""``, a module reached under two names takes the first, a module
    outside the model is tagged with its class name). Without a model, a path is the class
    names of the calls it ran inside (``"GPT2LMHeadModel.GPT2Model.GPT2Block"``).
    ``setters``: more callables that receive every tag change, after torch's and the CPU
    recording's (each call is made on the thread whose tag changes).
    ``backward=False``: tag forward and optimizer steps only, without the gradient hooks
    (they are most of the cost: one autograd node pre-hook per module call). Backward
    allocations then carry no module (recomputation by activation checkpointing is still
    tagged ``backward:<module>``).

    Use ``install()`` / ``uninstall()``, or ``with ModuleTagger(model):``.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> tags = []
        >>> with ModuleTagger(model, setters=[tags.append]):
        ...     _ = model(torch.ones(1, 2))
        >>> tags
        ['forward:', 'forward:0', 'forward:', 'forward:1', 'forward:', '', '']
    """

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        setters: Sequence[Setter] | None = None,
        backward: bool = True,
    ) -> None:
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"ModuleTagger(model): model must be a torch.nn.Module or None, "
                f"got {type(model).__name__}"
            )
        extra = list(setters or ())
        for setter in extra:
            if not callable(setter):
                raise TypeError(
                    f"ModuleTagger(setters): each setter must be callable with the tag (str), "
                    f"got {setter!r}"
                )
        if not isinstance(backward, bool):
            raise TypeError(
                f"ModuleTagger(backward): backward must be True or False, got {backward!r}"
            )
        self._model = model
        self._extra = extra
        self._backward = backward
        self._handles: list[Any] = []  # the global hooks
        self._grad_handles: list[Any] = []  # the tensor gradient hooks, pruned when dead
        self._prune_at = 1024
        self._active = False
        self._names: dict[int, tuple[weakref.ref[torch.nn.Module], tuple[str, str, str]]] = {}
        self._class_paths: dict[tuple[str, type], tuple[str, str, str]] = {}
        self._tasks: dict[int, _GraphTask] = {}
        self._tasks_lock = threading.Lock()
        self._state = _ThreadState()
        self._setters: tuple[Setter, ...] = ()
        self._cuda_pending = False
        self._cuda_before: str | None = None

    # -- install / uninstall -------------------------------------------------------------

    def install(self) -> ModuleTagger:
        """Start tagging: add the global module and optimizer hooks. Returns self.

        Raises RuntimeError if this or another tagger is installed already.
        """
        global _installed
        with _installed_lock:
            if _installed is self:
                raise RuntimeError(
                    "ModuleTagger.install(): this tagger is installed already; "
                    "call uninstall() before installing it again"
                )
            if _installed is not None:
                raise RuntimeError(
                    "ModuleTagger.install(): another ModuleTagger is installed; uninstall it "
                    "first (two taggers would overwrite each other's tags)"
                )
            _installed = self
        try:
            self._start()
        except BaseException:
            self._stop()
            with _installed_lock:
                _installed = None
            raise
        return self

    def uninstall(self) -> None:
        """Stop tagging: remove every hook this tagger added and clear this thread's tag.

        Does nothing if the tagger is not installed.
        """
        global _installed
        with _installed_lock:
            if _installed is not self:
                return
        # Unhooked before it stops counting as installed: an interrupt in between leaves
        # it installed, and a second uninstall() finishes (removing a hook twice is fine).
        self._stop()
        with _installed_lock:
            if _installed is self:
                _installed = None

    def __enter__(self) -> ModuleTagger:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _start(self) -> None:
        self._names = {}
        if self._model is not None:
            for name, module in self._model.named_modules():  # skips repeats: first name wins
                self._names[id(module)] = (
                    weakref.ref(module),
                    (name, f"forward:{name}", f"backward:{name}"),
                )
        self._class_paths = {}
        self._tasks = {}
        self._state = _ThreadState()  # forget every thread's calls of an earlier install
        self._resolve_setters()
        self._active = True
        # Each handle is kept in the statement that registers its hook: nothing can come
        # between them (an interrupt would leave a hook no _stop() knows of).
        always = {"always_call": True} if _forward_hook_always_call() else {}
        self._handles.append(register_module_forward_pre_hook(self._forward_pre))
        self._handles.append(register_module_forward_hook(self._forward_post, **always))
        self._handles.append(register_optimizer_step_pre_hook(self._step_pre))
        self._handles.append(register_optimizer_step_post_hook(self._step_post))

    def _stop(self) -> None:
        self._active = False
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for handle in self._grad_handles:
            handle.remove()
        self._grad_handles.clear()
        self._prune_at = 1024
        with self._tasks_lock:
            self._tasks.clear()
        for setter in self._setters:
            setter("")
        if self._cuda_before:  # the user's own tag, as it was at install
            cuda = cuda_tag_setter()
            if cuda is not None:
                cuda(self._cuda_before)
        self._setters = ()
        self._state = _ThreadState()

    def _resolve_setters(self) -> None:
        setters: list[Setter] = []
        cuda = cuda_tag_setter()
        self._cuda_before = None
        if cuda is not None:
            get = getattr(torch.cuda.memory, "_get_memory_metadata", None)
            self._cuda_before = get() if get is not None else None
            setters.append(cuda)
        # CUDA may be initialised after install: look again at each tag change until it is.
        self._cuda_pending = (
            cuda is None
            and hasattr(torch.cuda.memory, "_set_memory_metadata")
            and torch.cuda.is_available()
        )
        cpu = cpu_tag_setter()
        if cpu is not None:
            setters.append(cpu)
        setters.extend(self._extra)
        self._setters = tuple(setters)

    # -- the tag ---------------------------------------------------------------------------

    def _emit(self, state: _ThreadState, tag: str) -> None:
        """Give this thread's tag to the setters if it changed (hot callers check first)."""
        if tag == state.last:
            return
        state.last = tag
        if self._cuda_pending and torch.cuda.is_initialized():
            self._cuda_pending = False
            cuda = cuda_tag_setter()
            if cuda is not None:
                self._setters = (cuda, *self._setters)
        for setter in self._setters:
            setter(tag)

    def _tag_for(self, state: _ThreadState, task_id: int) -> str:
        """This thread's tag: its innermost forward call, else the innermost module whose
        backward runs in ``task_id`` (-1: none), else the optimizer step, else ""."""
        if state.calls:
            return state.calls[-1].tag
        if task_id != -1:
            task = self._tasks.get(task_id)
            if task is not None and task.active:
                return task.active[-1].names[2]
            return "backward:"
        return state.optimizer

    def _other_names(self, module: torch.nn.Module, parent: _Call | None) -> tuple[str, str, str]:
        """The names of a module not in the model (its class), or of any module when no
        model was given (the class names of the calls it ran inside)."""
        if self._model is not None:
            path = type(module).__name__
            return path, f"forward:{path}", f"backward:{path}"
        parent_path = parent.names[0] if parent is not None else ""
        key = (parent_path, type(module))
        names = self._class_paths.get(key)
        if names is None:
            name = type(module).__name__
            path = f"{parent_path}.{name}" if parent_path else name
            names = self._class_paths[key] = (path, f"forward:{path}", f"backward:{path}")
        return names

    # -- forward ---------------------------------------------------------------------------

    def _forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        if not self._active or _is_compiling():
            return
        state = self._state
        calls = state.calls
        task_id = _graph_task_id()
        if calls:
            parent: _Call | None = calls[-1]
        elif task_id != -1:  # recomputation in backward: inside the module being backwarded
            task = self._task(task_id)  # its end puts this thread's tag back
            self._seen_here(state, task_id)
            parent = task.active[-1] if task.active else None
        else:
            parent = None
        known = self._names.get(id(module))
        if known is not None and known[0]() is module:
            names = known[1]
        else:
            names = self._other_names(module, parent)
        tag = names[1] if task_id == -1 else names[2]
        call = _Call(id(module), names, tag, parent)
        calls.append(call)
        if tag != state.last:
            self._emit(state, tag)
        if args and self._backward and torch.is_grad_enabled():
            inputs = _grad_tensors(args)
            if inputs:
                self._hook_grads(state, inputs, call, False)

    def _forward_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not self._active or _is_compiling():
            return
        state = self._state
        calls = state.calls
        if not calls:
            return
        module_id = id(module)
        call = calls[-1]
        if call.module_id == module_id:
            calls.pop()
        else:
            for index in range(len(calls) - 2, -1, -1):
                if calls[index].module_id == module_id:
                    call = calls[index]
                    # Calls above it were left by an exception without their post hook.
                    del calls[index:]
                    break
            else:
                return  # its pre hook never ran (another pre hook raised first)
        tag = calls[-1].tag if calls else self._tag_for(state, _graph_task_id())
        if tag != state.last:
            self._emit(state, tag)
        if output is not None and self._backward and torch.is_grad_enabled():
            outputs = _grad_tensors(output)
            if outputs:
                self._hook_grads(state, outputs, call, True)
        if not calls:  # the outermost call returned: hold no autograd node
            state.node = state.node_hook = None

    def _hook_grads(
        self, state: _ThreadState, tensors: list[torch.Tensor], call: _Call, enter: bool
    ) -> None:
        """Add ``call`` entering (outputs) or leaving (inputs) to the pre-hooks of the nodes
        that made ``tensors``. A node pre-hook rather than a tensor hook: it costs a third,
        and the node of the last call's output is usually the next call's input node."""
        hooks: list[_NodeHook] = []
        for tensor in tensors:
            node = tensor.grad_fn
            if node is None:
                continue
            hook = state.node_hook
            if node is not state.node or hook is None:
                hook = _NodeHook(self)
                handles = self._grad_handles
                handles.append(node.register_prehook(hook))
                if len(handles) >= self._prune_at:  # drop handles whose graph is gone
                    handles[:] = [h for h in handles if _handle_alive(h)]
                    self._prune_at = max(1024, 2 * len(handles))
                state.node = node  # held only until this thread's outermost call returns
                state.node_hook = hook
            if hook not in hooks:
                hooks.append(hook)
                actions = hook.actions
                actions.append(call)
                actions.append(enter)
        if not enter:
            call.inputs = len(hooks)

    # -- backward --------------------------------------------------------------------------

    def _task(self, task_id: int) -> _GraphTask:
        task = self._tasks.get(task_id)
        if task is None:
            with self._tasks_lock:
                task = self._tasks.get(task_id)
                if task is None:
                    task = self._tasks[task_id] = _GraphTask()
                    torch.autograd.Variable._execution_engine.queue_callback(
                        lambda: self._backward_done(task_id)
                    )
        return task

    def _seen_here(self, state: _ThreadState, task_id: int) -> None:
        tasks = state.graph_tasks
        if not tasks or tasks[-1] != task_id:
            if task_id in tasks:
                del tasks[tasks.index(task_id) + 1 :]
            else:
                tasks.append(task_id)

    def _backward_step(self, actions: list[Any]) -> None:
        """Calls enter or leave their backward (a node pre-hook ran on this thread)."""
        if not self._active:
            return
        task_id = _graph_task_id()
        if task_id == -1:
            return
        task = self._task(task_id)
        with self._tasks_lock:
            for index in range(0, len(actions), 2):
                call = actions[index]
                if actions[index + 1]:
                    self._enter(task, call)
                else:
                    self._leave(task, call)
        state = self._state
        self._seen_here(state, task_id)
        tag = self._tag_for(state, task_id)
        if tag != state.last:
            self._emit(state, tag)

    @staticmethod
    def _enter(task: _GraphTask, call: _Call) -> None:
        if call in task.started:  # a call with several output nodes starts once
            return
        task.started.add(call)
        active = task.active
        # Calls inside this one whose output is this one's output were hooked first on
        # the same node: keep them above it, they are the innermost.
        index = len(active)
        while index > 0 and active[index - 1].inside(call):
            index -= 1
        active.insert(index, call)

    @staticmethod
    def _leave(task: _GraphTask, call: _Call) -> None:
        waiting = task.pending.get(call, call.inputs)
        if waiting > 1:  # it ends when the nodes of all its inputs have run
            task.pending[call] = waiting - 1
            return
        task.pending.pop(call, None)
        try:
            task.active.remove(call)
        except ValueError:
            pass  # it never started (its outputs got no gradient)

    def _backward_done(self, task_id: int) -> None:
        with self._tasks_lock:
            self._tasks.pop(task_id, None)
        if not self._active:
            return
        state = self._state
        tasks = state.graph_tasks
        if task_id in tasks:
            del tasks[tasks.index(task_id) :]
        outer = tasks[-1] if tasks and tasks[-1] in self._tasks else -1
        self._emit(state, self._tag_for(state, outer))

    # -- optimizer -------------------------------------------------------------------------

    def _step_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self._active:
            return
        state = self._state
        state.optimizer = f"optimizer:{type(optimizer).__name__}"
        self._emit(state, self._tag_for(state, _graph_task_id()))

    def _step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self._active:
            return
        state = self._state
        state.optimizer = ""
        self._emit(state, self._tag_for(state, _graph_task_id()))
