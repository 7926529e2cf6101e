"""The values a training step reads on the host, known on fake tensors where a real step knows
them.

Fake tensors hold no data, so a model that reads one of its tensors on the host (``if
mask.all():``, ``.item()``, ``nonzero()``) cannot run on them, and libraries that ask
whether a tensor is fake take their graph-safe path instead (transformers, for one,
materialises a (B, 1, L, L) attention mask and repeats grouped keys and values where a real
step passes ``is_causal=True``): a different step, with more memory, than the one the user
runs. Such reads are almost always of small tensors derived from the inputs (token ids,
attention masks, positions, lengths), whose values a real step computes from the very
tensors the user handed the estimate (and random draws, as OPT's layerdrop makes: drawn
here from a generator of our own).

So the small tensors keep their real values beside the fake ones: the inputs' and the
buffers' (copied once, on the CPU), and every op whose tensor arguments all have values (or
a factory op such as ``arange``) and whose output is small computes its value too, on the
CPU; an in-place op on a tensor with a value either updates it (its arguments have values)
or forgets it. A host read of a tensor with a value is answered with it; ``nonzero`` and its
kin give a fake tensor of the real shape. A read of a value nobody knows (one computed from
the weights, as a mixture-of-experts router's) still fails as before, and ``eager_libraries``
below is undone for another try.

What costs nothing here is kept small: values of at most ``MAX_ELEMENTS`` elements, computed
only from such values.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

# The largest value kept: a batch of 64 sequences of 16k token ids is 1M elements (8 MiB).
MAX_ELEMENTS = 1 << 20

_aten = torch.ops.aten


def _ops(*names: str) -> set[Any]:
    """The aten overloads this torch has, of `names` ("nonzero.default", ...)."""
    found = set()
    for name in names:
        packet, overload = name.split(".")
        op = getattr(getattr(_aten, packet, None), overload, None)
        if op is not None:
            found.add(op)
    return found


# Reads whose output's value (or shape) is the data's: answered from a known value.
_SCALAR_READS = _ops("_local_scalar_dense.default", "is_nonzero.default")
_SHAPE_READS = _ops(
    "nonzero.default",
    "masked_select.default",
    "_unique2.default",
    "unique_consecutive.default",
    "unique_dim.default",
    "repeat_interleave.Tensor",
)
# Indexing with a boolean mask: its output's shape is the mask's count of true elements.
_BOOLEAN_INDEXED = _ops("index.Tensor", "index_put.default", "index_put_.default")


class KnownValues:
    """Real CPU values of small fake tensors, keyed by the fake tensor (weakly)."""

    def __init__(self) -> None:
        # id(fake) -> (a weak reference to it, its value): keyed by identity, as tensors
        # compare element by element (a WeakKeyDictionary would compare them).
        self._values: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        # Storages written by an op whose value could not be computed: no value of a tensor
        # on them can be trusted again (views share the storage, not the entry).
        self._unknown: set[int] = set()
        # Temporaries an answer made that the real kernel makes too (a boolean mask's
        # indices): the recorder counts them, then lets them go.
        self.made: list[torch.Tensor] = []

    def remember(self, fake: torch.Tensor, real: torch.Tensor) -> None:
        """`fake`'s value is `real` (a user's input or buffer, before the step)."""
        if _is_fake(real) or real.device.type == "meta" or real.numel() > MAX_ELEMENTS:
            return
        if tuple(real.shape) != tuple(fake.shape):
            return
        with _disable_current_modes():
            value = real.detach().to("cpu", copy=True).to(fake.dtype)
        self._set_fresh(fake, value)

    def value(self, t: Any) -> torch.Tensor | None:
        """`t`'s real value: its known one, itself for a real (non-fake) tensor, or None."""
        if not isinstance(t, torch.Tensor):
            return None
        if not _is_fake(t):
            return t if t.device.type != "meta" else None
        entry = self._values.get(id(t))
        if entry is None or entry[0]() is not t or _storage_key(t) in self._unknown:  # type: ignore[arg-type]
            return None
        return entry[1]

    def _set_fresh(self, fake: torch.Tensor, value: torch.Tensor) -> None:
        """`fake` is new, on a storage of its own: its value stands even where a storage
        freed earlier at the same address was marked unknown (``_unknown`` holds addresses,
        and a freed storage's address is soon another's)."""
        self._unknown.discard(_storage_key(fake))
        self._set(fake, value)

    def _set(self, fake: torch.Tensor, value: torch.Tensor) -> None:
        key = id(fake)
        values = self._values

        def forget(ref: weakref.ref) -> None:
            if values.get(key, (None,))[0] is ref:
                del values[key]

        values[key] = (weakref.ref(fake, forget), value)

    def answer(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The result of a host read whose inputs have values, else NotImplemented (the fake
        mode then raises as it always did)."""
        if func in _BOOLEAN_INDEXED:
            return self._boolean_index(func, args, kwargs)
        if func is _aten.masked_select.default and self.value(args[0]) is None:
            return self._masked_select(args[0], args[1])
        if func not in _SCALAR_READS and func not in _SHAPE_READS:
            return NotImplemented
        real = self._compute(func, args, kwargs)
        if real is NotImplemented:
            return NotImplemented
        if func in _SCALAR_READS:
            return real
        # A fake tensor of the real shape on the fake device; its value is known.
        device = _fake_device(args, kwargs)
        outs, spec = tree_flatten(real)
        fakes = [
            torch.empty_strided(tuple(o.shape), o.stride(), dtype=o.dtype, device=device)
            if isinstance(o, torch.Tensor)
            else o
            for o in outs
        ]
        for fake, value in zip(fakes, outs):
            if isinstance(fake, torch.Tensor):
                self._set_fresh(fake, value)
        return spec.unflatten(fakes)

    def _boolean_index(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """``x[mask]`` (and ``x[mask] = v``) with a mask whose value is known: the mask
        becomes the long indices of its true elements, as torch's own kernels turn it, and
        the op runs on fake tensors with them (``x`` needs no value)."""
        indices = args[1] if len(args) > 1 else kwargs.get("indices")
        if not isinstance(indices, (list, tuple)):
            return NotImplemented
        bools = [t for t in indices if _is_tensor(t) and t.dtype in (torch.bool, torch.uint8)]
        if not bools or any(self.value(t) is None for t in bools):
            return NotImplemented
        longs: list[Any] = []
        for t in indices:
            if isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8):
                with _disable_current_modes():  # on the real value, below no mode
                    columns = self.value(t).nonzero().unbind(1)  # type: ignore[union-attr]
                for column in columns:
                    fake = torch.empty(tuple(column.shape), dtype=torch.long, device=t.device)
                    self._set_fresh(fake, column)
                    self.made.append(fake)
                    longs.append(fake)
            else:
                longs.append(t)
        if len(args) > 1:
            return func(args[0], longs, *args[2:], **kwargs)
        return func(*args, **{**kwargs, "indices": longs})

    def _masked_select(self, x: torch.Tensor, mask: torch.Tensor) -> Any:
        """``x.masked_select(mask)`` with a known mask: as many elements as the mask, spread
        to their common shape, holds true."""
        value = self.value(mask)
        if value is None:
            return NotImplemented
        shape = torch.broadcast_shapes(tuple(x.shape), tuple(mask.shape))
        with _disable_current_modes():
            count = int(value.expand(shape).sum())
        return torch.empty((count,), dtype=x.dtype, device=x.device)

    def follow(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """After the fake op ran: compute its outputs' values where its inputs have them."""
        schema = func._schema
        mutates = schema.is_mutable  # an argument is written (in place, out=)
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        small = all(t.numel() <= MAX_ELEMENTS for t in outs) and bool(outs)
        real = NotImplemented
        if small:
            real = self._compute(func, args, kwargs)
        if real is NotImplemented:
            if mutates:
                for a, value in zip(schema.arguments, _bound(schema, args, kwargs)):
                    if a.alias_info is not None and a.alias_info.is_write:
                        for t in tree_flatten(value)[0]:
                            if isinstance(t, torch.Tensor) and _is_fake(t):
                                self._unknown.add(_storage_key(t))
            return
        reals = [t for t in tree_flatten(real)[0] if isinstance(t, torch.Tensor)]
        if len(reals) != len(outs) or mutates:  # in place: the values were updated in place
            return
        inputs = {_storage_key(t) for t in tree_flatten((args, kwargs))[0] if _is_tensor(t)}
        for fake, value in zip(outs, reals):
            if _is_fake(fake) and tuple(fake.shape) == tuple(value.shape):
                self._set(fake, value)
                key = _storage_key(fake)
                if key not in inputs:  # a new storage where an unknown one lay before
                    self._unknown.discard(key)

    def _compute(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """`func` on the real values of its arguments, on the CPU; NotImplemented when an
        argument's value is unknown (or the op fails there)."""
        missing = False

        def real(x: Any) -> Any:
            nonlocal missing
            if isinstance(x, torch.Tensor):
                v = self.value(x)
                if v is None:
                    missing = True
                return v
            if isinstance(x, torch.device) and x.type != "cpu":
                return torch.device("cpu")
            return x

        real_args = tree_map(real, args)
        real_kwargs = tree_map(real, kwargs)
        if missing:
            return NotImplemented
        random = torch.Tag.nondeterministic_seeded in func.tags
        if random:
            # A random value (OPT's and BART's layerdrop draw one per layer and branch on
            # it): drawn from a generator of our own, seeded the same each time, so the
            # user's generators do not advance and the estimate repeats; a branch on it goes
            # as one real draw would.
            real_kwargs.pop("generator", None)
        try:
            with _disable_current_modes(), torch.no_grad(), _own_generator(random):
                return func(*real_args, **real_kwargs)
        except Exception:  # an op the CPU cannot run (a CUDA-only kernel): value unknown
            return NotImplemented


@contextlib.contextmanager
def _own_generator(random: bool) -> Iterator[None]:
    """For a random op: the CPU generator's state put back after it, seeded 0 for it."""
    if not random:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        yield


def _is_tensor(t: Any) -> bool:
    return isinstance(t, torch.Tensor)


def _is_fake(t: torch.Tensor) -> bool:
    return isinstance(t, FakeTensor)


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _fake_device(args: tuple, kwargs: dict) -> torch.device:
    for t in tree_flatten((args, kwargs))[0]:
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


def _bound(schema: Any, args: tuple, kwargs: dict) -> list[Any]:
    """The schema's arguments' values, in its order."""
    values = []
    for i, a in enumerate(schema.arguments):
        if i < len(args):
            values.append(args[i])
        else:
            values.append(kwargs.get(a.name))
    return values


@contextlib.contextmanager
def eager_libraries() -> Iterator[bool]:
    """While the fake step runs, libraries that ask whether a tensor is fake hear "no", as
    in the real step they stand for, so they take their eager path (host reads answered by
    KnownValues). Today that is transformers (``utils.import_utils.is_fake_tensor``, which
    its ``is_tracing`` consults). Yields whether anything was changed; everything is put
    back on exit. Module globals: another thread using transformers at the same moment
    would hear "no" too (a real tensor is never fake, so only fake runs could differ)."""
    utils = sys.modules.get("transformers.utils.import_utils")
    original = getattr(utils, "is_fake_tensor", None) if utils is not None else None
    patched: list[Any] = []
    if callable(original):
        for name, module in list(sys.modules.items()):
            if name.startswith("transformers") and module is not None:
                if getattr(module, "__dict__", {}).get("is_fake_tensor") is original:
                    module.__dict__["is_fake_tensor"] = _never_fake
                    patched.append(module)
    try:
        yield bool(patched)
    finally:
        for module in patched:
            module.__dict__["is_fake_tensor"] = original


def _never_fake(_x: Any) -> bool:
    return False
