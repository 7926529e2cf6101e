"""Where a zoo row's real step allocates what fake tensors cannot see: per aten op.

For a row of ``bench/zoo_workloads.py`` (``--only``), one real step (after a first one, so
the optimizer state exists) runs under a ``TorchDispatchMode`` that brackets every aten op
(forward, backward and optimizer; the autograd engine carries the mode to its thread) and
reads the allocator around it:

- scratch: the op's peak above what was allocated when it began, less what it leaves
  allocated (memory a kernel takes and gives back inside one op: cuDNN or oneDNN
  workspaces, reorder buffers, fp32 copies of 16-bit operands);
- kept: what the op leaves allocated beyond its outputs' new storages (a cache, a
  workspace that stays).

A fake tensor shows an op's outputs only, so both are what ``memlab_rs.estimate`` cannot
count. The ops with the most are printed, summed by op and phase. CUDA reads
``max_memory_allocated()`` with the peak reset before each op; CPU reads the CPU trace
(``_core._cpu_trace_start``: every allocation and free, with marks per op).

Run: ``python bench/zoo_hidden.py --device cpu --only "plain_vgg fp32 sgd-foreach"``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import os
import sys
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import estimate_zoo  # noqa: E402
import zoo_workloads as zoo  # noqa: E402

MIB = 2**20


class _Bracket(TorchDispatchMode):
    """Calls `before()` and `after(name, outputs)` around every op."""

    def __init__(self, before, after):
        super().__init__()
        self.before, self.after = before, after
        self.phase = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        token = self.before()
        out = func(*args, **(kwargs or {}))
        self.after(token, str(func), self.phase, out)
        return out


def _new_bytes(out, live: dict[int, weakref.ref], block: int = 1) -> int:
    """The bytes of `out`'s storages that were not alive before (each rounded up to
    `block`); `live` holds a weak reference to each storage seen (torch keeps a storage's
    Python object as long as the storage, so it dies with it)."""
    total = 0
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            s = t.untyped_storage()
            ref = live.get(s._cdata)
            if ref is None or ref() is None:
                live[s._cdata] = weakref.ref(s)
                total += -(-s.nbytes() // block) * block
    return total


class CudaProbe:
    def __init__(self):
        self.records: list[tuple[str, str, int, int]] = []
        self.known: dict[int, weakref.ref] = {}

    def before(self):
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()

    def after(self, start, name, phase, out):
        end = torch.cuda.memory_allocated()
        peak = torch.cuda.max_memory_allocated()
        kept = end - start - _new_bytes(out, self.known, 512)  # the allocator's rounding
        self.records.append((phase, name, peak - end, kept))

    def start(self):
        pass

    def stop(self):
        pass


class CpuProbe:
    def __init__(self):
        from memlab_rs import _core

        self.core = _core
        self.spans: list[tuple[str, str, int, int, int]] = []  # phase, op, begin, end, outputs
        self.known: dict[int, weakref.ref] = {}

    def start(self):
        self.core._cpu_start()
        self.core._cpu_trace_start(8_000_000)

    def before(self):
        return self.core._cpu_trace_mark()

    def after(self, begin, name, phase, out):
        end = self.core._cpu_trace_mark()
        self.spans.append((phase, name, begin, end, _new_bytes(out, self.known)))

    def stop(self):
        trace = self.core._cpu_trace_stop()
        self.core._cpu_stop()
        entries = trace["device_traces"][0] if trace["device_traces"] else []
        self.records = []
        for phase, name, begin, end, outputs in self.spans:
            running = best = 0
            for e in entries[begin:end]:
                if e["action"] == "alloc":
                    running += e["size"]
                elif e["action"] == "free_completed":
                    running -= e["size"]
                best = max(best, running)
            self.records.append((phase, name, best - running, running - outputs))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--only", required=True, help="the row (a substring of its name)")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    row = next(r for r in zoo.rows(args.device) if args.only in r.name)
    device = "cuda:0" if args.device == "cuda" else "cpu"
    device_type = torch.device(device).type
    w = row.workload
    model = w.build()
    if row.checkpointing:
        zoo.enable_checkpointing(model, w)
    model.train()
    if row.dtype is not None:
        model.to(device=device, dtype=row.dtype)
    else:
        model.to(device)
    inputs, targets = w.make_inputs()
    inputs = estimate_zoo._to(inputs, device, row.dtype)
    targets = estimate_zoo._to(targets, device, None)
    cls, kwargs = row.optimizer_spec()
    opt = cls(model.parameters(), **kwargs)
    scaler = torch.amp.GradScaler(device_type, init_scale=1024.0) if row.grad_scaler else None
    loss_fn = w.loss_fn()

    def step(mark):
        estimate_zoo.train_step(
            model, inputs, targets, loss_fn, opt, scaler, row.autocast, device_type, mark
        )

    step(lambda name: None)  # the optimizer state exists from here
    gc.collect()
    probe = CudaProbe() if device_type == "cuda" else CpuProbe()
    mode = _Bracket(probe.before, probe.after)

    def mark(name):
        mode.phase = name

    probe.start()
    try:
        with mode:
            step(mark)
    finally:
        probe.stop()
    print(f"{row.name} on {device}: ops with memory fake tensors do not show (step 2)")
    for title, index in (("scratch (peak above the op's end)", 2), ("kept beyond outputs", 3)):
        by_op: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
        for rec in probe.records:
            if rec[index] > 0:
                by_op[(rec[0], rec[1])].append(rec[index])
        total = {phase: 0 for phase in ("forward", "backward", "optimizer")}
        for (phase, _), values in by_op.items():
            total[phase] = max(total.get(phase, 0), max(values))
        print(
            f"\n{title}, largest in one call, MiB: "
            + ", ".join(f"{p} {v / MIB:.2f}" for p, v in total.items())
        )
        ranked = sorted(by_op.items(), key=lambda kv: -max(kv[1]))[: args.top]
        for (phase, name), values in ranked:
            print(
                f"  {phase:<9} {name:<48} calls {len(values):>4}  max {max(values) / MIB:8.2f}"
                f"  sum {sum(values) / MIB:8.2f}"
            )
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
