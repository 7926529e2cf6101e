"""The validation zoo: ``memlab_rs.estimate`` against real training steps on models nobody
tuned it for (issue 24).

For each row of ``bench/zoo_workloads.py`` (at least 24 models from torchvision and
transformers with random weights, in fp32, bf16, autocast bf16 and autocast fp16 with a
GradScaler; SGD with momentum, Adam and AdamW in their foreach and fused forms; activation
checkpointing of the repeated blocks off and on) it prints the estimated and the real peak of
the first and of the steady step, and their error. A row the estimate cannot do shows the
exception's message (``FakeStepError``: a data-dependent op, an op without a fake kernel)
instead of numbers; one whose settings the estimate does not take yet (``autocast=``,
``grad_scaler=``, an optimizer instance) shows "not modelled yet: <message>".

What is compared, per row (the estimate's definition of a step's peak):

- estimated: ``step_peaks[1]`` (first step) and ``step_peaks[2]`` (steady step) of
  ``memlab_rs.estimate(model, inputs, optimizer=Class, optimizer_kwargs=..., dtype=...,
  autocast=..., grad_scaler=...)``: the absolute peak allocated during the step, with the
  parameters, buffers and inputs on the device before it and the cuBLAS workspaces counted as
  they are first allocated;
- real (CUDA): in this one process, after everything of the previous row is gone (gc,
  ``torch._C._cuda_clearCublasWorkspaces()``, ``empty_cache()``, and
  ``memory_allocated() == 0`` checked), the model is moved to the GPU (``model.to(device)``,
  as a user does), the inputs and the optimizer made, and three steps run, each
  ``out = model(inputs); loss = loss_fn(out); loss.backward(); opt.step();
  opt.zero_grad(set_to_none=True)`` in a function (forward and loss under ``torch.autocast``
  when asked; ``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()`` with the
  GradScaler), with the peak statistics reset at each phase: ``max_memory_allocated()`` of
  step 1 is the real first step, the larger of steps 2 and 3 the steady one;
- real (CPU): the CPU source's counters (``_core._cpu_start``/``_cpu_stats``, as
  ``tests/unit/estimate/test_estimate.py`` reads them): each step's rise of
  ``allocated_bytes.all.peak`` over what was allocated when it began, added to what the
  row's own tensors held when step 1 began (parameters, buffers, inputs, targets: the
  estimate's ``setup``) and what each step left; the CPU trace
  (``_core._cpu_trace_start``) gives the phases' peaks and ends. torch runs on one thread
  there unless ``--threads`` says otherwise.

For a row more than 3% off (every row with ``--phases``), the real phases' peaks and ends
(forward, backward, optimizer of steps 1 and 2) are printed beside the estimate's
``phase_peaks`` and ``phase_ends``, with the estimate's peak by category, so that a miss can
be located (a transient a kernel takes inside one op shows as a higher peak with equal ends:
``bench/zoo_hidden.py`` then names the op). The real steps run for a row with no estimate
too, so its real peaks are known.

Run (GPU machine, about 6-8 minutes): ``python bench/estimate_zoo.py --device cuda --out
bench/results/estimate_zoo_h100.txt --max-seconds 450``; CPU, the small models:
``python bench/estimate_zoo.py --device cpu --quick --out PATH``. ``--only SUBSTRING`` keeps
the rows whose name has it (``--only "llama_gqa bf16"``); ``--estimate-only`` skips the real
steps (no GPU needed for ``--device cuda``: the estimates' times and refusals);
``--max-seconds`` starts no row after that long (the table so far is written at each row).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import os
import platform
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

import memlab_rs
from memlab_rs.estimation import _kernel_probe

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_workloads as zoo  # noqa: E402

WITHIN = 0.03
MIB = 2**20
# The new estimate arguments (autocast=, grad_scaler=, an optimizer instance): a TypeError
# naming them means this memlab_rs does not take them yet.
NEW_ARGUMENTS = ("autocast", "grad_scaler", "instance", "unexpected keyword")
CPU_TRACE_ENTRIES = 4_000_000


@dataclass
class Outcome:
    row: zoo.Row
    settings: str
    est: Any = None  # MemoryEstimate
    est_error: str = ""
    est_seconds: float = 0.0
    real: dict[str, Any] | None = None
    real_error: str = ""
    real_seconds: float = 0.0
    instance: str = "-"  # the instance form's estimate against the class form's
    instance_error: str = ""
    notes: list[str] = field(default_factory=list)

    def errors(self) -> tuple[float, float] | None:
        if self.est is None or self.real is None:
            return None
        first = self.est.step_peaks[1] / self.real["first"] - 1
        steady = self.est.step_peaks.get(2, self.est.step_peaks[1]) / self.real["steady"] - 1
        return first, steady


# -- the estimate --------------------------------------------------------------------------


def estimate(row: zoo.Row, model, inputs, targets, device: str, optimizer=None):
    """The estimate of `row`'s step, and an error text instead when it raises."""
    cls, kwargs = row.optimizer_spec()
    args: dict[str, Any] = {
        "optimizer": cls,
        "optimizer_kwargs": kwargs,
        "loss_fn": row.workload.loss_fn(),
        "targets": targets,
        "device": device,
        "dtype": row.dtype,
    }
    if optimizer is not None:
        args["optimizer"] = optimizer
        del args["optimizer_kwargs"]
    if row.autocast is not None:
        args["autocast"] = row.autocast
    if row.grad_scaler:
        args["grad_scaler"] = True
    try:
        return memlab_rs.estimate(model, inputs, **args), ""
    except TypeError as error:
        text = _first_line(error)
        new = row.autocast is not None or optimizer is not None
        if new and any(word in text for word in NEW_ARGUMENTS):
            return None, f"not modelled yet: {text}"
        return None, f"TypeError: {text}"
    except Exception as error:  # the row says why, the zoo goes on
        return None, f"{type(error).__name__}: {_first_line(error)}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else repr(error)


# -- the real steps ------------------------------------------------------------------------


def _to(value: Any, device: str, dtype: torch.dtype | None) -> Any:
    def move(t):
        if not isinstance(t, torch.Tensor):
            return t
        if dtype is not None and t.is_floating_point():
            return t.to(device=device, dtype=dtype)
        return t.to(device=device)

    return tree_map(move, value)


def _forward(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def train_step(model, inputs, targets, loss_fn, opt, scaler, autocast, device_type, mark):
    """One step as the estimate defines it; `mark(phase)` before each phase. The output and
    the loss live until it returns."""
    mark("forward")
    amp = torch.autocast(device_type, dtype=autocast) if autocast else contextlib.nullcontext()
    with amp:
        out = _forward(model, inputs)
        loss = out.loss if loss_fn is None else loss_fn(out, targets)
    mark("backward")
    if scaler is not None:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    mark("optimizer")
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    opt.zero_grad(set_to_none=True)


class CudaMeter:
    """Peaks of a step's phases: ``max_memory_allocated()`` with peak stats reset at each."""

    def __init__(self, device: str):
        self.device = device

    def clean(self) -> int:
        """Free what earlier rows left, as a fresh process starts: what is still allocated."""
        gc.collect()
        if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
            torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()

    def step(self, run) -> dict[str, Any]:
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        phases: dict[str, int] = {}
        ends: dict[str, int] = {}
        current: list[str] = []

        def mark(name: str) -> None:
            torch.cuda.synchronize()
            if current:
                phases[current[-1]] = torch.cuda.max_memory_allocated()
                ends[current[-1]] = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            current.append(name)

        torch.cuda.reset_peak_memory_stats()
        run(mark)
        mark("")
        end = torch.cuda.memory_allocated()
        peak = max(phases.values())
        return {"start": start, "end": end, "peak": peak, "phases": phases, "ends": ends}


class CpuMeter:
    """The CPU source's counters over a step (its rise over the step's start) and the CPU
    trace's entries for the phases (the running sum of allocations and frees)."""

    def __init__(self) -> None:
        from memlab_rs import _core

        self.core = _core
        self.start_bytes = 0  # what the row's own tensors held when step 1 began
        self.notes: list[str] = []

    def clean(self) -> int:
        gc.collect()
        return 0

    def begin(self, tensors: list[torch.Tensor]) -> None:
        seen: dict[int, int] = {}
        for t in tensors:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        self.start_bytes = sum(seen.values())

    def _current(self) -> int:
        return dict(self.core._cpu_stats())["allocated_bytes.all.current"]

    def step(self, run) -> dict[str, Any]:
        core = self.core
        gc.collect()
        mode = core._cpu_start()
        try:
            if mode != "allocator":
                raise RuntimeError(f"the CPU source counts by {mode}, not the allocator hook")
            c0 = self._current()
            marks: list[tuple[str, int]] = []
            core._cpu_trace_start(CPU_TRACE_ENTRIES)
            try:
                run(lambda name: marks.append((name, core._cpu_trace_mark())))
            finally:
                trace = core._cpu_trace_stop()
            stats = dict(core._cpu_stats())
        finally:
            core._cpu_stop()
        rise = stats["allocated_bytes.all.peak"] - c0
        delta = stats["allocated_bytes.all.current"] - c0
        start = self.start_bytes
        self.start_bytes += delta
        phases, ends = self._phases(trace, marks, start)
        if trace["memlab_rs"]["dropped"]:
            self.notes.append("CPU trace dropped entries: phase peaks incomplete")
        elif phases and max(phases.values()) != start + rise:
            self.notes.append(
                f"CPU trace's peak {max(phases.values()) - start} != counters' {rise}"
            )
        peak = start + rise
        return {"start": start, "end": start + delta, "peak": peak, "phases": phases, "ends": ends}

    @staticmethod
    def _phases(trace, marks, start: int) -> tuple[dict[str, int], dict[str, int]]:
        """Each phase's peak and end, from the running sum of the trace's entries."""
        entries = trace["device_traces"][0] if trace["device_traces"] else []
        ends = [at for _, at in marks[1:]] + [len(entries)]
        phases: dict[str, int] = {}
        phase_ends: dict[str, int] = {}
        running = 0
        i = 0
        for (name, _), end in zip(marks, ends):
            best = running
            while i < min(end, len(entries)):
                e = entries[i]
                if e["action"] == "alloc":
                    running += e["size"]
                elif e["action"] == "free_completed":
                    running -= e["size"]
                best = max(best, running)
                i += 1
            phases[name] = start + best
            phase_ends[name] = start + running
        return phases, phase_ends


def measure(row: zoo.Row, model, inputs, targets, device: str, meter, outcome: Outcome):
    """Three real steps of `row` on `device`: the first and steady peaks and the phases."""
    w = row.workload
    device_type = torch.device(device).type
    if row.dtype is not None:
        model.to(device=device, dtype=row.dtype)
    else:
        model.to(device)
    inputs = _to(inputs, device, row.dtype)
    targets = _to(targets, device, None)
    cls, kwargs = row.optimizer_spec()
    opt = cls(model.parameters(), **kwargs)
    scaler = None
    if row.grad_scaler:
        # A smaller first scale than the default 65536, so that no step is skipped for an
        # inf (the estimate models steps taken); skips are still reported.
        scaler = torch.amp.GradScaler(device_type, init_scale=1024.0)
    if row.instance:
        started = time.perf_counter()
        inst, error = estimate(row, model, inputs, targets, device, optimizer=opt)
        outcome.est_seconds += time.perf_counter() - started
        outcome.instance = _instance_column(outcome, inst, error)
        del inst
        gc.collect()
    if isinstance(meter, CpuMeter):
        own = [*model.parameters(), *model.buffers(), *tree_flatten([inputs, targets])[0]]
        meter.begin([t for t in own if isinstance(t, torch.Tensor)])
    loss_fn = w.loss_fn()
    steps = {}
    skipped = 0
    for n in (1, 2, 3):
        scale = scaler.get_scale() if scaler is not None else None

        def run(mark):
            train_step(
                model, inputs, targets, loss_fn, opt, scaler, row.autocast, device_type, mark
            )

        steps[n] = meter.step(run)
        if scaler is not None and scaler.get_scale() < scale:
            skipped += 1
    if skipped:
        outcome.notes.append(f"GradScaler skipped {skipped} of 3 steps (inf/nan gradients)")
    phases, ends = {}, {}
    for n in (1, 2):
        phases[f"start {n}"] = ends[f"start {n}"] = steps[n]["start"]
        for name, peak in steps[n]["phases"].items():
            phases[f"{name} {n}"] = peak
            ends[f"{name} {n}"] = steps[n]["ends"][name]
    phases["step 3"] = steps[3]["peak"]
    ends["step 3"] = steps[3]["end"]
    return {
        "first": steps[1]["peak"],
        "steady": max(steps[2]["peak"], steps[3]["peak"]),
        "phases": phases,
        "ends": ends,
    }


def _instance_column(outcome: Outcome, inst, error: str) -> str:
    if error:
        outcome.instance_error = error
        if error.startswith("not modelled yet"):
            return "not yet"  # said once, under the table
        outcome.notes.append(f"optimizer instance: {error}")
        return "error"
    if outcome.est is not None and inst.step_peaks == outcome.est.step_peaks:
        return "same"
    outcome.notes.append(f"optimizer instance: step peaks {inst.step_peaks}")
    return "differs"


# -- one row -------------------------------------------------------------------------------


def run_row(row: zoo.Row, base, device: str, meter, real: bool) -> Outcome:
    """`row` on a copy of `base` (the workload's model, built once on the CPU)."""
    w = row.workload
    model = copy.deepcopy(base)
    settings = row.settings
    attn = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if w.hf and attn not in (None, "sdpa"):
        settings += f" attn={attn}"
    outcome = Outcome(row, settings)
    try:
        if row.checkpointing:
            zoo.enable_checkpointing(model, w)
        model.train()
        inputs, targets = w.make_inputs()
    except Exception as error:
        outcome.est_error = f"setup failed: {type(error).__name__}: {_first_line(error)}"
        return outcome
    started = time.perf_counter()
    outcome.est, outcome.est_error = estimate(row, model, inputs, targets, device)
    outcome.est_seconds = time.perf_counter() - started
    gc.collect()
    if not real:
        return outcome
    # The real steps run for a row with no estimate too: its real peaks are in the table.
    started = time.perf_counter()
    left = meter.clean()
    if left:
        outcome.notes.append(f"{left} bytes still allocated at the row's start")
    try:
        outcome.real = measure(row, model, inputs, targets, device, meter, outcome)
    except Exception as error:
        outcome.real_error = f"real step failed: {type(error).__name__}: {_first_line(error)}"
        if os.environ.get("ZOO_TRACEBACK"):
            traceback.print_exc()
    finally:
        del model, inputs, targets
        meter.clean()
    if isinstance(meter, CpuMeter):
        outcome.notes += meter.notes
        meter.notes = []
    outcome.real_seconds = time.perf_counter() - started
    return outcome


# -- the table -----------------------------------------------------------------------------

HEAD = (
    f"{'model':<18} {'family':<11} {'settings':<28} {'est 1st':>9} {'real 1st':>9} "
    f"{'err':>7} {'est stdy':>9} {'real stdy':>9} {'err':>7} {'inst':>7} {'est+real s':>10}"
)


def mib(n: int | None) -> str:
    return f"{n / MIB:9.1f}" if n is not None else f"{'-':>9}"


def line(o: Outcome) -> str:
    """A row of the table: the peaks and errors, or what stopped the estimate or the real
    steps at the end of the line."""
    w = o.row.workload
    left = f"{w.name:<18} {w.family:<11} {o.settings:<28}"
    seconds = f"{o.est_seconds:5.1f}+{o.real_seconds:4.1f}"
    est1 = est2 = real1 = real2 = None
    if o.est is not None:
        est1, est2 = o.est.step_peaks[1], o.est.step_peaks.get(2)
    if o.real is not None:
        real1, real2 = o.real["first"], o.real["steady"]
    errors = o.errors()
    e1, e2 = (f"{e * 100:+6.1f}%" for e in errors) if errors else (f"{'-':>7}", f"{'-':>7}")
    text = (
        f"{left} {mib(est1)} {mib(real1)} {e1} {mib(est2)} {mib(real2)} {e2} "
        f"{o.instance:>7} {seconds}"
    )
    why = [t for t in (o.est_error, o.real_error) if t]
    if errors and max(abs(e) for e in errors) > WITHIN:
        why.insert(0, "<- off")
    if o.real is None and not o.real_error and o.est is not None:
        why.append("(estimate only)")
    return text + ("  " + "; ".join(why) if why else "")


def details(o: Outcome, always: bool = False) -> list[str]:
    """For a row off by more than 3% (every row with `always`): the estimate's and the real
    phases, side by side."""
    out = [f"    note: {note}" for note in o.notes]
    errors = o.errors()
    if errors is None or (max(abs(e) for e in errors) <= WITHIN and not always):
        return out
    est = o.est
    real = o.real["phases"]
    names = ["start 1", "forward 1", "backward 1", "optimizer 1"]
    names += ["start 2", "forward 2", "backward 2", "optimizer 2", "step 3"]
    est_of = {
        "start 1": est.phase_ends.get("setup"),
        "start 2": est.phase_ends.get("optimizer 1"),
        **est.phase_peaks,
    }
    est_end = {
        "start 1": est.phase_ends.get("setup"),
        "start 2": est.phase_ends.get("optimizer 1"),
        **est.phase_ends,
    }
    real_end = o.real["ends"]
    out.append("    phase (MiB)  " + " ".join(f"{n:>11}" for n in names))
    out.append("    est peak     " + " ".join(f"{_m(est_of.get(n)):>11}" for n in names))
    out.append("    real peak    " + " ".join(f"{_m(real.get(n)):>11}" for n in names))
    out.append("    est end      " + " ".join(f"{_m(est_end.get(n)):>11}" for n in names))
    out.append("    real end     " + " ".join(f"{_m(real_end.get(n)):>11}" for n in names))
    cats = ", ".join(f"{k} {v / MIB:.1f}" for k, v in est.peak_by_category.items() if v)
    out.append(f"    estimated peak ({est.peak_phase}) by category, MiB: {cats}")
    return out


def _m(n: int | None) -> str:
    return "-" if n is None else f"{n / MIB:.1f}"


def summary(outcomes: list[Outcome]) -> list[str]:
    measured = [o for o in outcomes if o.errors() is not None]
    refused = [o for o in outcomes if o.est is None]
    not_yet = [o for o in refused if o.est_error.startswith("not modelled yet")]
    within = [o for o in measured if max(abs(e) for e in o.errors()) <= WITHIN]
    lines = [
        f"rows: {len(outcomes)}; compared: {len(measured)}; within 3% on both steps: "
        f"{len(within)} of {len(measured)}; no estimate: {len(refused)} "
        f"({len(not_yet)} not modelled yet); real step failed: "
        f"{sum(1 for o in outcomes if o.real_error)}"
    ]
    if measured:
        worst = max(measured, key=lambda o: max(abs(e) for e in o.errors()))
        e1, e2 = worst.errors()
        which, err = ("first", e1) if abs(e1) >= abs(e2) else ("steady", e2)
        lines.append(f"worst: {err * 100:+.1f}% ({which} step) on {worst.row.name}")
    return lines


def header(device: str, quick: bool) -> list[str]:
    versions = [f"torch {torch.__version__}", f"memlab_rs {memlab_rs.__version__}"]
    for package in ("torchvision", "transformers"):
        try:
            versions.append(f"{package} {__import__(package).__version__}")
        except ImportError:
            versions.append(f"{package} missing")
    where = (
        torch.cuda.get_device_name()
        if device.startswith("cuda") and torch.cuda.is_available()
        else f"{platform.machine()}, {os.cpu_count()} CPUs, torch on {torch.get_num_threads()} "
        "thread(s)"
    )
    left_out = []
    if device == "cpu":
        family, precision = zoo.CPU_LEFT_OUT
        left_out.append(f"left out on the CPU: {precision} of the {family}s (no fast fp16 conv)")
    return [
        f"memlab_rs.estimate validation zoo on {device} ({where}){' --quick' if quick else ''}",
        *left_out,
        ", ".join(versions) + f", Python {platform.python_version()}",
        "peaks in MiB (2^20 bytes); err = estimated / real - 1; first = step 1, steady = "
        "max(step 2, step 3) real against the estimate's step 2",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", help="write the table to this file too")
    parser.add_argument("--only", help="keep the rows whose name contains this")
    parser.add_argument(
        "--family", help="keep the rows of these families (comma-separated: cnn,vit,...)"
    )
    parser.add_argument("--quick", action="store_true", help="the small models only")
    parser.add_argument(
        "--estimate-only", action="store_true", help="no real steps (times the estimates)"
    )
    parser.add_argument(
        "--phases", action="store_true", help="phases of every row, not only misses"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads for torch with --device cpu (default 1: on a shared 2-core machine "
        "two threads' spinning made a step 10-30x slower); 0 keeps torch's default",
    )
    parser.add_argument("--max-seconds", type=float, help="start no row after this many seconds")
    args = parser.parse_args(argv)
    if not args.estimate_only and args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a GPU for the real steps (or --estimate-only)")
    if args.device == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    selected = zoo.rows(args.device, quick=args.quick)
    if args.only:
        selected = [r for r in selected if args.only in r.name]
    if args.family:
        families = set(args.family.split(","))
        selected = [r for r in selected if r.workload.family in families]
    out = header(args.device, args.quick)  # imports torchvision and transformers
    out.append(f"{len(selected)} rows, {len({r.workload.name for r in selected})} models")
    out += ["", HEAD]
    for text in out:
        print(text, flush=True)
    # What exists now (torch, torchvision, transformers: modules, functions) lives as long as
    # the process: out of the collector's walks, each gc.collect() takes milliseconds, not
    # half a second (the zoo collects before each row and each CPU step).
    gc.collect()
    gc.freeze()
    try:
        # One worker process measures every row's convolutions (the estimate's kernel probe):
        # one torch import and CUDA context for the run, not one per row.
        with _kernel_probe.held_open():
            outcomes = run_rows(selected, args, out)
    finally:
        gc.unfreeze()  # so that interpreter shutdown frees them as usual
    tail = [""]
    for error in sorted({o.instance_error for o in outcomes if o.instance == "not yet"}):
        tail.append(f"inst 'not yet' (the estimate given the optimizer instance): {error}")
    tail += summary(outcomes)
    out += tail
    for text in tail:
        print(text)
    if args.out:
        _write(args.out, out)
    return 0


def run_rows(selected: list[zoo.Row], args, out: list[str]) -> list[Outcome]:
    """Every row in order, printed (and written to --out) as it ends."""
    device = "cuda:0" if args.device == "cuda" else "cpu"
    real = not args.estimate_only
    meter = (CudaMeter(device) if args.device == "cuda" else CpuMeter()) if real else None
    started = time.perf_counter()
    outcomes: list[Outcome] = []
    built: tuple[str, Any] = ("", None)  # the current model, built once on the CPU
    for row in selected:
        if args.max_seconds and time.perf_counter() - started > args.max_seconds:
            out.append(f"(stopped: --max-seconds {args.max_seconds:g} reached)")
            print(out[-1])
            break
        w = row.workload
        if built[0] != w.name:
            built = ("", None)
            gc.collect()
            try:
                built = (w.name, w.build())
            except Exception as error:
                built = (w.name, error)
        if isinstance(built[1], Exception):
            outcome = Outcome(row, row.settings)
            outcome.est_error = f"build failed: {type(built[1]).__name__}: {_first_line(built[1])}"
        else:
            outcome = run_row(row, built[1], device, meter, real)
        outcomes.append(outcome)
        for text in [line(outcome), *details(outcome, args.phases)]:
            out.append(text)
            print(text, flush=True)
        if args.out:
            _write(args.out, out)
    out.append(f"total {time.perf_counter() - started:.0f} s")
    print(out[-1])
    return outcomes


def _write(path: str, lines: list[str]) -> None:
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
