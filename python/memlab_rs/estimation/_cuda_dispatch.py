"""CUDA's dispatch, put back on the fake meta tensors the CUDA estimate runs on.

Above autograd, a CUDA tensor's dispatch does two things a meta tensor's does not:

- **autocast** (the ``AutocastCUDA`` dispatch key, ``aten/src/ATen/autocast_mode.cpp``):
  inside a ``torch.autocast("cuda")`` region, the ops on its lists cast their floating
  arguments (to the region's dtype, to float32, or to the widest type), and a weight's cast
  (a leaf that requires grad) is kept in a cache until the outermost region exits;
- **CUDA's branches of composite ops**: the fused dropout (a 1-byte mask), the attention
  kernel ``scaled_dot_product_attention`` picks, softmax of a half input to float without
  a copy.

Both are put back where they happen: Python kernels on a spare autocast dispatch key
(``AutocastIPU``, below ``AutocastCUDA``; no tensor here carries it), included in the
thread's dispatch keys while the step runs. They see every aten op called above autograd,
those called inside ``torch.nn.functional``'s Python functions included (a
``TorchFunctionMode`` would not: each Python function hides the calls it makes), and
autograd records what they do (the casts and their backward) as it records CUDA's.

Which ops autocast, and how, is torch's own, for the version installed: the dispatcher says
which ops have an ``AutocastCUDA`` kernel, and the kernel itself says what it does. It is
run once per op and arguments' dtypes on *probes* (tensor subclass instances on ``cuda``
without storage, CUDA's autocast switched on for the thread: no GPU is touched); the probes
record each cast and the call it makes below autocast, and that plan is replayed on the
fake meta tensors, with the cast cache as ``cached_cast`` keeps it.

The autocast state is the thread's real one (``torch.is_autocast_enabled("cuda")``,
``torch.get_autocast_dtype("cuda")``), so a ``torch.autocast("cuda", enabled=False)`` region
in model code turns the emulation off inside it, as on a GPU. While the step runs,
``torch.autocast`` regions opened by model code for ``"cuda"`` or ``"meta"`` (the device
of the tensors it sees: ``x.device.type``) act as CUDA regions do on a GPU (without this,
"meta" is refused and "cuda" turns itself off without a GPU); other threads are unaffected.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch._prims_common import suggest_memory_format
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_unflatten

_aten = torch.ops.aten
# Spare autocast keys below AutocastCUDA (the probe's call below autocast must reach ours).
_SPARE_KEYS = ("AutocastIPU", "AutocastHPU")
_META = torch.device("meta")


def autocast_ops() -> list[str]:
    """The ops that have a CUDA autocast kernel (``ns::name.overload``), as registered now."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return [n for n in torch._C._dispatch_get_all_op_names() if has(n, "AutocastCUDA")]


def _op(qualified: str) -> torch._ops.OpOverload:
    namespace, name = qualified.split("::", 1)
    packet, _, overload = name.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")


def _spare_key(names: list[str]) -> Any:
    for key_name in _SPARE_KEYS:
        key = getattr(torch._C.DispatchKey, key_name, None)
        if key is None or torch._C._dispatch_has_backend_fallback(key):
            continue
        if any(torch._C._dispatch_has_kernel_for_dispatch_key(n, key_name) for n in names):
            continue
        return key
    raise RuntimeError(
        f"no spare dispatch key to emulate CUDA on meta tensors ({', '.join(_SPARE_KEYS)} "
        "are all in use in this process)"
    )


# -- the probe: autocast's own kernel, run on tensors without storage -----------------------

_probing = threading.local()


class _Probe(torch.Tensor):
    """An argument (or a value made from one) while autocast's kernel runs on it: a tensor
    on ``cuda`` without storage; every op on it is recorded, its result computed on meta."""

    ref: tuple[Any, ...]
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @staticmethod
    def __new__(cls, ref: tuple[Any, ...], like: torch.Tensor) -> _Probe:
        device = torch.device("cuda") if like.device.type == "meta" else like.device
        probe = torch.Tensor._make_wrapper_subclass(
            cls, like.shape, strides=like.stride(), dtype=like.dtype, device=device
        )
        probe.ref = ref
        return probe

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _probing.plan.step(func, args, kwargs or {})


def _on_meta(value: Any) -> Any:
    """A probe as a plain meta tensor, a CUDA device as meta (the live tensors are meta)."""
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, torch.device) and value.type == "cuda":
        return _META
    return value


class _Plan:
    """What autocast's kernel did for one op and its arguments' dtypes: its steps (an op and
    its arguments, each a reference to an input, an earlier step's output or a value) and
    what it returned."""

    def __init__(self, below: Any):
        self.below = below  # the keys to leave out while computing the probes' results
        self.steps: list[tuple[Any, Any, list[tuple[Any, ...]]]] = []
        self.result: tuple[Any, list[tuple[Any, ...]]] | None = None

    def step(self, func: Any, args: tuple, kwargs: dict) -> Any:
        leaves, spec = tree_flatten((args, kwargs))
        refs = [v.ref if isinstance(v, _Probe) else ("value", v) for v in leaves]
        with torch._C._ExcludeDispatchKeyGuard(self.below), torch.no_grad():
            a, k = tree_unflatten([_on_meta(v) for v in leaves], spec)
            out = func(*a, **k)
        index = len(self.steps)
        self.steps.append((func, spec, refs))
        out_leaves, out_spec = tree_flatten(out)
        wrapped = [
            _Probe(("out", index, j), t) if isinstance(t, torch.Tensor) else t
            for j, t in enumerate(out_leaves)
        ]
        return tree_unflatten(wrapped, out_spec)

    def finish(self, out: Any) -> None:
        leaves, spec = tree_flatten(out)
        self.result = (spec, [v.ref if isinstance(v, _Probe) else ("value", v) for v in leaves])


def _signature(value: Any) -> Any:
    """What a plan depends on: tensors' dtypes and devices, the other values themselves."""
    if isinstance(value, torch.Tensor):
        return ("T", value.dtype, value.device.type)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *map(_signature, value))
    if isinstance(value, dict):
        return ("D", *((k, _signature(v)) for k, v in value.items()))
    try:
        hash(value)
    except TypeError:
        raise _Unhashable from None
    return (type(value).__name__, value)


class _Unhashable(Exception):
    """An argument a plan cannot be keyed by: probe again each time."""


# What autocast's kernel does, by op, the region's dtype and the arguments' signature: the
# same for every estimate in this process (a memo, bounded).
_PLANS: dict[Any, _Plan] = {}
_MAX_PLANS = 20_000


# -- the kernels ----------------------------------------------------------------------------


class CudaDispatch:
    """Installs the kernels for the step (a context manager) and opens autocast regions
    (``autocast(dtype)``). `book` hears of tensors CUDA keeps elsewhere (the CPU seed and
    offset of memory-efficient attention)."""

    def __init__(self, book: Any):
        self.book = book
        self.names = autocast_ops()
        self.autocast_set = {_op(n) for n in self.names}
        self.key = _spare_key([*self.names, *(str(op.name()) for op in _BRANCHES)])
        self.keyset = torch._C.DispatchKeySet(self.key)
        # Below the Python key (the fake mode's kernels), neither ours nor CUDA's autocast.
        self.below = self.keyset | torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCUDA)
        self.after = torch._C._dispatch_keyset_full_after(self.key)
        self.cache: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        self._libraries: list[torch.library.Library] = []
        self._undo: list[Callable[[], None]] = []

    # -- installing ---------------------------------------------------------------------------

    def __enter__(self) -> CudaDispatch:
        key_name = self.key.name
        try:
            fallback = torch.library.Library("_", "IMPL")
            self._libraries.append(fallback)
            fallback.fallback(torch.library.fallthrough_kernel, key_name)
            by_namespace: dict[str, torch.library.Library] = {}
            ops = {op: None for op in [*(_op(n) for n in self.names), *_BRANCHES]}
            for op in ops:
                namespace, name = str(op.name()).split("::", 1)  # name.overload
                if namespace not in by_namespace:
                    by_namespace[namespace] = torch.library.Library(namespace, "IMPL")
                    self._libraries.append(by_namespace[namespace])
                by_namespace[namespace].impl(name, self._kernel(op), key_name, with_keyset=True)
            excluded = torch._C._dispatch_tls_is_dispatch_key_excluded(self.key)
            included = torch._C._dispatch_tls_is_dispatch_key_included(self.key)
            torch._C._dispatch_tls_set_dispatch_key_excluded(self.key, False)
            torch._C._dispatch_tls_set_dispatch_key_included(self.key, True)

            def restore_keys() -> None:
                torch._C._dispatch_tls_set_dispatch_key_included(self.key, included)
                torch._C._dispatch_tls_set_dispatch_key_excluded(self.key, excluded)

            self._undo.append(restore_keys)
            _patch_autocast(self, self._undo)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        while self._undo:
            self._undo.pop()()
        while self._libraries:
            self._libraries.pop()._destroy()
        self.cache.clear()

    @contextmanager
    def autocast(self, dtype: torch.dtype) -> Iterator[None]:
        """An outermost ``torch.autocast("cuda", dtype)`` region, as on a GPU."""
        enabled = torch.is_autocast_enabled("cuda")
        previous = torch.get_autocast_dtype("cuda")
        cache_enabled = torch.is_autocast_cache_enabled()
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", dtype)
        torch.autocast_increment_nesting()
        torch.set_autocast_cache_enabled(True)
        try:
            yield
        finally:
            if torch.autocast_decrement_nesting() == 0:
                torch.clear_autocast_cache()
                self.cache.clear()
            torch.set_autocast_enabled("cuda", enabled)
            torch.set_autocast_dtype("cuda", previous)
            torch.set_autocast_cache_enabled(cache_enabled)

    def exclude_below(self) -> Any:
        """The guard the recorder holds while the fake mode runs an op."""
        return torch._C._ExcludeDispatchKeyGuard(self.below)

    # -- running ------------------------------------------------------------------------------

    def _kernel(self, op: Any) -> Callable[..., Any]:
        branch = _BRANCHES.get(op)
        autocasts = op in self.autocast_set

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            plan = getattr(_probing, "plan", None)
            if plan is not None:  # the call autocast's kernel makes below itself, on probes
                return plan.step(op, args, kwargs)
            if autocasts and torch.is_autocast_enabled("cuda"):
                return self._autocast(op, args, kwargs)
            below = keyset & self.after
            if branch is not None:
                return branch(self, op, below, args, kwargs)
            return op.redispatch(below, *args, **kwargs)

        return kernel

    def _autocast(self, op: Any, args: tuple, kwargs: dict) -> Any:
        lower = torch.get_autocast_dtype("cuda")
        try:
            key = (op, lower, _signature(args), _signature(kwargs))
        except _Unhashable:
            return self._replay(self._probe(op, args, kwargs), args, kwargs)
        plan = _PLANS.get(key)
        if plan is None:
            if len(_PLANS) >= _MAX_PLANS:
                _PLANS.clear()
            plan = _PLANS[key] = self._probe(op, args, kwargs)
        return self._replay(plan, args, kwargs)

    def _probe(self, op: Any, args: tuple, kwargs: dict) -> _Plan:
        leaves, spec = tree_flatten((args, kwargs))
        probes = [
            _Probe(("in", i), v) if isinstance(v, torch.Tensor) else v for i, v in enumerate(leaves)
        ]
        a, k = tree_unflatten(probes, spec)
        plan = _Plan(self.below)
        with _disable_current_modes():
            _probing.plan = plan
            try:
                out = op(*a, **k)
            finally:
                _probing.plan = None
        plan.finish(out)
        return plan

    def _replay(self, plan: _Plan, args: tuple, kwargs: dict) -> Any:
        inputs = tree_flatten((args, kwargs))[0]
        values: dict[tuple[Any, ...], Any] = {}

        def get(ref: tuple[Any, ...]) -> Any:
            if ref[0] == "in":
                return inputs[ref[1]]
            if ref[0] == "out":
                return values[ref]
            return _on_meta(ref[1]) if isinstance(ref[1], torch.device) else ref[1]

        lower = torch.get_autocast_dtype("cuda")
        cache = torch.is_autocast_cache_enabled()
        # What autocast's kernel calls runs with CUDA's autocast left out, as its own guard
        # leaves it out (our kernels still run: CUDA's branches of the ops it calls).
        with torch._C._ExcludeDispatchKeyGuard(
            torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCUDA)
        ):
            for index, (func, spec, refs) in enumerate(plan.steps):
                a, k = tree_unflatten([get(r) for r in refs], spec)
                if func is _aten._to_copy.default and refs[0][0] == "in":
                    out = self._cached_cast(a[0], k, lower, cache, func)
                else:
                    out = func(*a, **k)
                for j, t in enumerate(tree_flatten(out)[0]):
                    values[("out", index, j)] = t
        assert plan.result is not None
        spec, refs = plan.result
        return tree_unflatten([get(r) for r in refs], spec)

    def _cached_cast(self, src: torch.Tensor, kwargs: dict, lower: Any, cache: bool, func: Any):
        """``cached_cast``: a leaf float32 tensor that requires grad (a weight) cast to the
        region's dtype is cast once, and kept, until the outermost region exits."""
        cacheable = (
            cache
            and kwargs.get("dtype") == lower
            and src.dtype == torch.float32
            and src.requires_grad
            and src.is_leaf
            and not src._is_view()
        )
        if not cacheable:
            return func(src, **kwargs)
        hit = self.cache.get(id(src))
        if hit is not None and hit[0]() is src:
            return hit[1]
        out = func(src, **kwargs)
        self.cache[id(src)] = (weakref.ref(src), out)
        return out


# -- CUDA's branches of composite ops -----------------------------------------------------


def _dropout(dispatch: CudaDispatch, op: Any, below: Any, args: tuple, kwargs: dict) -> Any:
    """``dropout`` (aten/src/ATen/native/Dropout.cpp): on CUDA, training with 0 < p < 1 runs
    the fused ``native_dropout`` (a 1-byte mask); meta would take the CPU branch (a mask of
    the input's dtype)."""
    names = ("input", "p", "train")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    x, p, train = bound["input"], bound["p"], bound["train"]
    if train and 0 < p < 1 and x.numel() > 0:
        return _aten.native_dropout.default(x, p, train)[0]
    return op.redispatch(below, *args, **kwargs)


def _softmax_branch(half_to_float: Any) -> Callable[..., Any]:
    def run(dispatch: CudaDispatch, op: Any, below: Any, args: tuple, kwargs: dict) -> Any:
        """``softmax``/``log_softmax`` (SoftMax.cpp): on CUDA a half input asked for float
        runs ``_softmax(x, dim, half_to_float=True)``, without the float copy."""
        bound = dict(zip(("input", "dim", "dtype"), args))
        bound.update(kwargs)
        x = bound["input"]
        if x.dtype == torch.float16 and bound.get("dtype") == torch.float32:
            return half_to_float(x, bound["dim"], True)
        return op.redispatch(below, *args, **kwargs)

    return run


def sdpa_backend(
    q: torch.Tensor, attn_mask: Any, enable_gqa: bool, k: Any = None, v: Any = None
) -> str:
    """The kernel torch picks on an sm80+ GPU (sdp_utils.cpp: flash, then memory-efficient,
    then math) among those enabled (``torch.nn.attention.sdpa_kernel``,
    ``torch.backends.cuda.enable_flash_sdp``, ...): flash takes 16-bit inputs without a mask
    and head size <= 256, and grouped keys and values (``enable_gqa``) natively; the
    memory-efficient kernel does not take grouped ones (math repeats them). No fused kernel
    takes a query, key, value or mask whose last dimension is strided
    (``check_last_dim_stride_equals_1_dense``): T5's position bias is a permuted embedding,
    so its self-attention runs the math kernel, which keeps the attention probabilities
    (measured with ``torch._fused_sdp_choice`` on an H200, torch 2.11)."""
    operands = [t for t in (q, k, v, attn_mask) if isinstance(t, torch.Tensor) and t.dim()]
    if any(t.stride(-1) != 1 for t in operands):
        return "math"
    head = q.shape[-1]
    flash = torch.backends.cuda.flash_sdp_enabled()
    efficient = torch.backends.cuda.mem_efficient_sdp_enabled()
    if flash and q.dtype in (torch.float16, torch.bfloat16) and attn_mask is None and head <= 256:
        return "flash"
    if enable_gqa:
        return "math"
    if efficient and (head % 8 == 0 or (q.dtype == torch.float32 and head % 4 == 0)):
        return "efficient"
    return "math"


def _sdpa(dispatch: CudaDispatch, op: Any, below: Any, args: tuple, kwargs: dict) -> Any:
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    q, k, v = bound["query"], bound["key"], bound["value"]
    mask = bound.get("attn_mask")
    p = bound.get("dropout_p", 0.0)
    causal = bound.get("is_causal", False)
    scale = bound.get("scale")
    backend = sdpa_backend(q, mask, bound.get("enable_gqa", False), k, v)
    if backend == "flash":
        return _aten._scaled_dot_product_flash_attention.default(
            q, k, v, p, causal, False, scale=scale
        )[0]
    if backend == "efficient" and not (mask is not None and mask.dtype == torch.bool):
        # (A boolean mask is converted to a float bias first: not modelled.)
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        out, _lse, seed, offset = _aten._scaled_dot_product_efficient_attention.default(
            q, k, v, mask, grad, p, causal, scale=scale
        )
        # CUDA makes the philox seed and offset on the CPU (outside graph capture).
        dispatch.book.uncount(seed)
        dispatch.book.uncount(offset)
        return out
    return op.redispatch(below, *args, **kwargs)


def _batch_norm(dispatch: CudaDispatch, op: Any, below: Any, args: tuple, kwargs: dict) -> Any:
    """``_batch_norm_impl_index`` (Normalization.cpp): CUDA runs cuDNN's batch norm (saved
    mean and variance, a reserve) where it can, meta the native one. cuDNN's minimum epsilon
    is 0 since cuDNN 8."""
    names = ("input", "weight", "bias", "running_mean", "running_var", "training")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    x, weight, bias = bound["input"], bound["weight"], bound["bias"]
    mean, var, training = bound["running_mean"], bound["running_var"], bound["training"]
    low = (torch.bfloat16,)
    use_cudnn = (
        weight is not None
        and bias is not None
        and x.dtype not in low
        and weight.dtype not in low
        and (x.dtype != torch.float16 or weight.dtype == torch.float32)
        and ((mean is not None and var is not None) or (mean is None and var is None and training))
        and x.dim() >= 3
        and x.shape[0] <= (880801 if training else 65535)
        and bool(args[8] if len(args) > 8 else kwargs.get("cudnn_enabled", True))
        and torch.backends.cudnn.is_available()
        and x.numel() < 2**31 - 1
    )
    if not use_cudnn:
        return op.redispatch(below, *args, **kwargs)
    momentum, eps = (args[6], args[7]) if len(args) > 7 else (kwargs["momentum"], kwargs["eps"])
    x = x.contiguous(memory_format=suggest_memory_format(x))
    out, save_mean, save_var, reserve = _aten.cudnn_batch_norm.default(
        x, weight.contiguous(), bias.contiguous(),
        None if mean is None else mean.contiguous(),
        None if var is None else var.contiguous(),
        training, momentum, eps,
    )  # fmt: skip
    return out, save_mean, save_var, reserve, 1


def _rms_norm(dispatch: CudaDispatch, op: Any, below: Any, args: tuple, kwargs: dict) -> Any:
    """``rms_norm``: CUDA runs the fused kernel ``_fused_rms_norm`` (its output and a float
    ``rstd``; autograd saves the input, ``rstd`` and the weight), meta the composite (``pow``,
    ``mean``, ``rsqrt``, two ``mul``: two input-sized tensors saved). On meta
    ``_fused_rms_norm`` is itself that composite, so the kernel is modelled by what it
    allocates (``_FusedRmsNorm``)."""
    bound = dict(zip(("input", "normalized_shape", "weight", "eps"), args))
    bound.update(kwargs)
    shape = list(bound["normalized_shape"])
    out, _rstd = _FusedRmsNorm.apply(bound["input"], shape, bound.get("weight"))
    return out


class _FusedRmsNorm(torch.autograd.Function):
    """The storages of CUDA's ``_fused_rms_norm`` and ``_fused_rms_norm_backward``
    (layer_norm_kernel.cu) as their fake kernels make them: the output (contiguous) and
    ``rstd`` (float for 16- and 32-bit inputs, one per normalized row); backward: the input's
    and the weight's gradients. Their internal scratch (a contiguous copy of a strided
    input) is not counted, as no kernel's is."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, shape: list[int], weight: Any) -> Any:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        rows = tuple(x.shape[: x.dim() - len(shape)]) + (1,) * len(shape)
        rstd = x.new_empty(rows, dtype=_accumulate(x.dtype))
        ctx.save_for_backward(x, rstd, weight)
        ctx.mark_non_differentiable(rstd)
        return out, rstd

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _grad_rstd: Any) -> Any:
        x, _rstd, weight = ctx.saved_tensors
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.empty_like(x, memory_format=torch.contiguous_format)
        grad_w = None
        if weight is not None and ctx.needs_input_grad[2]:
            grad_w = torch.empty_like(weight)
        return grad_x, None, grad_w


def _fused_sgd(dispatch: CudaDispatch, op: Any, below: Any, args: tuple, kwargs: dict) -> Any:
    """``_fused_sgd_``: CUDA's kernel updates the parameters and momentum buffers in place and
    allocates nothing (``torch.optim.sgd._fused_sgd`` makes the first step's buffers in
    Python, where fake tensors see them); meta has no kernel for it."""
    return None


def _accumulate(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


_BRANCHES: dict[Any, Callable[..., Any]] = {
    _aten._batch_norm_impl_index.default: _batch_norm,
    **({_aten.rms_norm.default: _rms_norm} if hasattr(_aten, "_fused_rms_norm") else {}),
    _aten.dropout.default: _dropout,
    _aten.scaled_dot_product_attention.default: _sdpa,
    _aten.softmax.int: _softmax_branch(_aten._softmax.default),
    _aten.log_softmax.int: _softmax_branch(_aten._log_softmax.default),
    **{
        getattr(_aten._fused_sgd_, overload): _fused_sgd
        for overload in ("default", "tensor_lr")
        if hasattr(_aten, "_fused_sgd_") and hasattr(_aten._fused_sgd_, overload)
    },
}


# -- model code's own torch.autocast regions ------------------------------------------------

_patched = threading.local()
_patch_lock = threading.Lock()
_patch_users = 0
_original: dict[tuple[Any, str], Any] = {}


def _ours(device_type: Any) -> bool:
    return getattr(_patched, "on", False) and device_type in ("cuda", "meta")


def _autocast_init(self: Any, device_type: Any, *args: Any, **kwargs: Any) -> None:
    init = _original[(torch.amp.autocast_mode.autocast, "__init__")]
    if _ours(device_type):
        names = ("dtype", "enabled", "cache_enabled")
        bound = dict(zip(names, args))
        bound.update(kwargs)
        enabled = bound.pop("enabled", True)
        init(self, "cuda", enabled=False, **bound)
        self._enabled = enabled  # as on a GPU, where CUDA (and bfloat16) is available
        return
    init(self, device_type, *args, **kwargs)


def _autocast_exit(self: Any, *exc: Any) -> Any:
    out = _original[(torch.amp.autocast_mode.autocast, "__exit__")](self, *exc)
    dispatch = getattr(_patched, "dispatch", None)
    if dispatch is not None and _nesting() == 0:
        dispatch.cache.clear()  # the outermost region is the model's: its casts go
    return out


def _nesting() -> int:
    depth = torch.autocast_increment_nesting()
    torch.autocast_decrement_nesting()
    return depth - 1


def _as_cuda(owner: Any, name: str) -> Callable[..., Any]:
    """`owner.name(device_type, ...)` asked for "meta" answers for "cuda" in this thread
    (``torch.utils.checkpoint`` asks them for its recomputation's autocast)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        original = _original[(owner, name)]
        if args and getattr(_patched, "on", False) and args[0] == "meta":
            args = ("cuda", *args[1:])
        return original(*args, **kwargs)

    return wrapper


def _fused_devices(owner: Any, name: str) -> Callable[..., Any]:
    """The devices with fused optimizer kernels, "meta" among them in this thread: a fused
    optimizer (``fused=True``) checks its parameters' device at its first step, and the
    emulation's are meta; meta has the fused Adam and AdamW kernels' shapes, and fused SGD
    is ``_fused_sgd`` above."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        devices = _original[(owner, name)](*args, **kwargs)
        if getattr(_patched, "on", False) and "meta" not in devices:
            devices = [*devices, "meta"]
        return devices

    return wrapper


def _patches() -> list[tuple[Any, str, Any]]:
    cls = torch.amp.autocast_mode.autocast
    patches = [
        (cls, "__init__", _autocast_init),
        (cls, "__exit__", _autocast_exit),
        (torch.amp, "is_autocast_available", _as_cuda(torch.amp, "is_autocast_available")),
        (torch, "is_autocast_enabled", _as_cuda(torch, "is_autocast_enabled")),
        (torch, "get_autocast_dtype", _as_cuda(torch, "get_autocast_dtype")),
    ]
    import torch.optim.optimizer as optimizer  # a submodule torch.optim does not bind

    name = "_get_fused_kernels_supported_devices"
    if hasattr(optimizer, name):  # looked up there by _device_dtype_check_for_fused
        patches.append((optimizer, name, _fused_devices(optimizer, name)))
    return patches


def _patch_autocast(dispatch: CudaDispatch, undo: list[Callable[[], None]]) -> None:
    """``torch.autocast`` regions model code opens for "cuda" or "meta", and the questions
    ``torch.utils.checkpoint`` asks for "meta", act as CUDA's in this thread (other threads
    see torch's own behaviour through the wrappers)."""
    global _patch_users
    with _patch_lock:
        if _patch_users == 0:
            for owner, name, replacement in _patches():
                _original[(owner, name)] = getattr(owner, name)
                setattr(owner, name, replacement)
        _patch_users += 1
    before = getattr(_patched, "on", False), getattr(_patched, "dispatch", None)
    _patched.on, _patched.dispatch = True, dispatch

    def restore() -> None:
        global _patch_users
        _patched.on, _patched.dispatch = before
        with _patch_lock:
            _patch_users -= 1
            if _patch_users == 0:
                for (owner, name), original in _original.items():
                    setattr(owner, name, original)
                _original.clear()

    undo.append(restore)
