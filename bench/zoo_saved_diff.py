"""What a zoo row's real forward keeps that the estimate's fake forward does not, per aten op.

``bench/estimate_zoo.py`` locates a miss by phase; when a row's real forward ends higher
than the estimate's (the real step keeps more for backward), this names the op whose
outputs make the difference. For the row's first step it sums, per aten op, the bytes of the
storages that op made during the forward and the loss and that are still alive when the loss
is there (what autograd saved, the output, the loss): once in the estimate's recording
(``memlab_rs.estimate``'s book, replayed to the end of ``forward 1``) and once on the real
device (a ``TorchDispatchMode`` over the real forward, with a weak reference to each new
storage). CUDA sizes are rounded up to the caching allocator's 512 bytes on both sides.
The ops whose sums differ are printed, largest difference first, with the shapes the real
side made.

Run (GPU machine): ``python bench/zoo_saved_diff.py --only "t5 enc-dec bf16 adamw-foreach"``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import gc
import os
import sys
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import estimate_zoo  # noqa: E402
import zoo_workloads as zoo  # noqa: E402

from memlab_rs.estimation import _fake_step, estimator  # noqa: E402

MIB = 2**20


def rounded(nbytes: int, cuda: bool) -> int:
    return (nbytes + 511) // 512 * 512 if cuda and nbytes else nbytes


def fake_side(row: zoo.Row, model, inputs, targets, device: str) -> dict[str, int]:
    """Per op: the bytes the estimate's forward 1 made that are alive at its end."""
    books: list[Any] = []
    original = estimator._record

    def keep(*args: Any, **kwargs: Any) -> Any:
        recorded = original(*args, **kwargs)
        books.append(recorded[0])
        return recorded

    estimator._record = keep
    try:
        est, error = estimate_zoo.estimate(row, model, inputs, targets, device)
    finally:
        estimator._record = original
    if est is None:
        raise SystemExit(f"no estimate: {error}")
    book = books[-1]
    cuda = book.device_type == "cuda"
    alive: dict[int, int] = {}
    phase = ""
    for op, ident, nbytes in book.events:
        if op == _fake_step.PHASE:
            phase = book.phase_names[ident]
            if phase == "backward 1" or phase == "forward 2":
                break
        elif op == _fake_step.ALLOC:
            if phase == "forward 1":
                alive[ident] = rounded(nbytes, cuda)
        else:
            alive.pop(ident, None)
    sums: dict[str, int] = collections.Counter()
    for ident, nbytes in alive.items():
        sums[book.origins[ident].rsplit(" (", 1)[0]] += nbytes
    return dict(sums)


class Made(TorchDispatchMode):
    """Each new storage an op returns: (weak reference, bytes, op, shape)."""

    def __init__(self, before: set[int]) -> None:
        super().__init__()
        self.before = before  # the storages alive before the forward (weights, inputs)
        self.made: dict[int, tuple[weakref.ref, int, str, tuple]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                key = storage._cdata
                if key in self.before:
                    continue
                known = self.made.get(key)
                if known is None or known[0]() is None:
                    self.made[key] = (
                        weakref.ref(storage),
                        storage.nbytes(),
                        str(func),
                        (tuple(t.shape), str(t.dtype).replace("torch.", "")),
                    )
        return out


def real_side(row: zoo.Row, model, inputs, targets, device: str):
    """Per op: the bytes the real forward made that are alive when the loss is there; and
    the shapes per op."""
    cuda = device.startswith("cuda")
    model = copy.deepcopy(model)
    if row.dtype is not None:
        model.to(device=device, dtype=row.dtype)
    else:
        model.to(device)
    inputs = estimate_zoo._to(inputs, device, row.dtype)
    targets = estimate_zoo._to(targets, device, None)
    loss_fn = row.workload.loss_fn()
    device_type = torch.device(device).type
    amp = (
        torch.autocast(device_type, dtype=row.autocast)
        if row.autocast
        else contextlib.nullcontext()
    )
    own = [*model.parameters(), *model.buffers(), *tree_flatten([inputs, targets])[0]]
    mode = Made({t.untyped_storage()._cdata for t in own if isinstance(t, torch.Tensor)})
    with mode, amp:
        out = estimate_zoo._forward(model, inputs)
        loss = out.loss if loss_fn is None else loss_fn(out, targets)
    sums: dict[str, int] = collections.Counter()
    shapes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for ref, nbytes, op, shape in mode.made.values():
        if ref() is not None:
            sums[op] += rounded(nbytes, cuda)
            shapes[op][shape] += 1
    del out, loss
    return dict(sums), shapes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--only", required=True, help="the row whose name contains this")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    device = "cuda:0" if args.device == "cuda" else "cpu"
    selected = [r for r in zoo.rows(args.device) if args.only in r.name]
    if not selected:
        raise SystemExit(f"no row matches {args.only!r}")
    row = selected[0]
    print(f"row: {row.name}")
    base = row.workload.build()
    model = copy.deepcopy(base)
    if row.checkpointing:
        zoo.enable_checkpointing(model, row.workload)
    model.train()
    inputs, targets = row.workload.make_inputs()
    fake = fake_side(row, model, inputs, targets, device)
    gc.collect()
    real, shapes = real_side(row, model, inputs, targets, device)
    ops = set(fake) | set(real)
    diffs = sorted(ops, key=lambda op: -abs(real.get(op, 0) - fake.get(op, 0)))
    print(f"alive at the end of forward 1, MiB: real {sum(real.values()) / MIB:.1f}, "
          f"estimate {sum(fake.values()) / MIB:.1f}")
    print(f"{'op':<58} {'real':>9} {'est':>9} {'real-est':>9}")
    for op in diffs[: args.top]:
        r, f = real.get(op, 0), fake.get(op, 0)
        if r == f:
            break
        print(f"{op:<58} {r / MIB:9.2f} {f / MIB:9.2f} {(r - f) / MIB:9.2f}")
        for shape, count in shapes.get(op, collections.Counter()).most_common(3):
            print(f"    real: {count} x {shape}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
