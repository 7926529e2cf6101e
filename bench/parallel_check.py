"""Per-rank estimates under data parallelism against real ranks (issue 24): ``memlab_rs.
estimate(..., world_size=N, parallel="ddp" | "fsdp2")`` beside the real peaks of every rank
of ``torchrun --nproc_per_node N``.

For each row (a workload of ``bench/zoo_workloads.py``: models nobody tuned the estimate
for, with their family's optimizer, foreach), each rank:

- builds the model on the CPU from the same seed; rank 0 estimates it (the CPU model, as a
  user would pass it, with the per-rank inputs);
- moves it to its GPU (``model.to(device)``, cast for ``bf16``), checkpoints its repeated
  blocks when asked (the library's function, as the estimate does on its fake copy) and
  wraps it: ``DistributedDataParallel(model, device_ids=[rank])``, or ``fully_shard`` on
  each of ``repeated_blocks(model)`` and then on the model (the blocks the estimate shards);
- makes the optimizer over the wrapped model's parameters and runs three steps exactly as
  ``bench/estimate_zoo.py`` does (``train_step``, peaks read with ``CudaMeter`` after the
  previous row is gone and the cuBLAS workspaces cleared): the peaks of steps 1, 2 and 3.

The table gives rank 0's estimate, every rank's real peaks and the errors against rank 0 (the
rank the estimate models: it holds the largest shards), step by step: the first, the second
and the third. Within 5% is the issue's bar. Under DDP on CUDA the estimate's second step is
a bound (a second set of bucket-sized buffers alive) and its third a floor (one set): a real
step after the first peaks at one or the other, rank by rank and step by step, as NCCL's
watchdog happens to sweep. ``ddp-settled`` rows run DDP with a pause after step 1 that lets
the watchdog sweep before step 2 (as a loop that evaluates or saves after a step does): its
steps 2 and 3 are compared with the floor.

Run on a machine with N GPUs: ``torchrun --nproc_per_node 2 bench/parallel_check.py --out
bench/results/parallel_check_h100x2.txt``; ``--only SUBSTRING`` keeps matching rows.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import platform
import sys
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

import memlab_rs
from memlab_rs.estimation.checkpointing import repeated_blocks

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import estimate_zoo  # noqa: E402
import zoo_workloads as zoo  # noqa: E402

WITHIN = 0.05
MIB = 2**20
# (workload, precision, checkpointing): CNNs, vision transformers, an encoder, decoders with
# and without grouped-query attention, an encoder-decoder and a mixture of experts.
ROWS = [
    ("resnet50", "fp32", False),
    ("convnext_tiny", "fp32", False),
    ("vit_b_16", "fp32", False),
    ("swin_t", "amp-bf16", False),
    ("bert", "fp32", False),
    ("gpt2", "fp32", False),
    ("gpt2", "fp32", True),
    ("llama_gqa", "bf16", False),
    ("llama_gqa", "amp-bf16", False),
    ("qwen2_gqa", "fp32", False),
    ("t5", "fp32", False),
    ("mixtral_moe", "bf16", False),  # its fake grouped mm takes bf16 only (torch 2.11)
]
MODES = ("ddp", "ddp-settled", "fsdp2")
# ddp-settled: after step 1, wait past a sweep of NCCL's watchdog (every 100 ms,
# kWatchdogThreadSleepMillis) before step 2, as a loop that pauses after its first step does
# (an evaluation, a checkpoint, a long data load). NCCL keeps an async collective's tensors on
# the work's shelf until the watchdog has seen it finish and a later collective is called on
# the main thread; once the sweep is past, step 2's bucket rebuild (a broadcast) lets step 1's
# buckets go before it allocates the new ones, so step 2 runs with one set.
SETTLE_SECONDS = 0.25


def wrap(model: torch.nn.Module, mode: str, rank: int) -> torch.nn.Module:
    if mode.startswith("ddp"):
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    from torch.distributed.fsdp import fully_shard

    for block in repeated_blocks(model):
        fully_shard(block)
    fully_shard(model)
    return model


def run_row(row: zoo.Row, mode: str, world: int, rank: int, device: str) -> dict[str, Any]:
    """This rank's real peaks of `row` under `mode` (and rank 0's estimate)."""
    w = row.workload
    meter = estimate_zoo.CudaMeter(device)
    left = meter.clean()
    out: dict[str, Any] = {"left": left}
    torch.manual_seed(0)
    model = w.build()
    inputs, targets = w.make_inputs()
    if rank == 0:
        cls, kwargs = row.optimizer_spec()
        started = time.perf_counter()
        try:
            est = memlab_rs.estimate(
                model, inputs, optimizer=cls, optimizer_kwargs=kwargs, loss_fn=w.loss_fn(),
                targets=targets, device=device, dtype=row.dtype, autocast=row.autocast,
                grad_scaler=row.grad_scaler, checkpointing=row.checkpointing,
                world_size=world, parallel=mode.removesuffix("-settled"),
            )  # fmt: skip
            out["est"] = [est.step_peaks[n] for n in sorted(est.step_peaks)]
            out["collective"] = est.collective_buffers
        except Exception as error:  # the row says why; the ranks go on together
            out["est_error"] = f"{type(error).__name__}: {estimate_zoo._first_line(error)}"
        out["est_seconds"] = time.perf_counter() - started
    dist.barrier()
    if row.dtype is not None:
        model.to(device=device, dtype=row.dtype)
    else:
        model.to(device)
    if row.checkpointing:
        zoo.enable_checkpointing(model, w)
    step_model = wrap(model, mode, rank)
    inputs = estimate_zoo._to(inputs, device, row.dtype)
    targets = estimate_zoo._to(targets, device, None)
    cls, kwargs = row.optimizer_spec()
    opt = cls(step_model.parameters(), **kwargs)
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0) if row.grad_scaler else None
    loss_fn = w.loss_fn()
    run = functools.partial(
        estimate_zoo.train_step, step_model, inputs, targets, loss_fn, opt, scaler,
        row.autocast, "cuda",
    )  # fmt: skip
    steps = []
    for n in range(3):
        steps.append(meter.step(run)["peak"])  # ends synchronized
        if n == 0 and mode.endswith("-settled"):
            time.sleep(SETTLE_SECONDS)
    out["steps"] = steps
    del run, step_model, model, opt, inputs, targets, scaler
    return out


def error(est: int, real: int) -> float:
    return est / real - 1


def line(name: str, mode: str, results: list[dict[str, Any]]) -> tuple[str, bool | None]:
    """The row: rank 0's estimate, every rank's real steps, rank 0's errors and the verdict.

    Compared: the first step with the estimate's first; steps 2 and 3 with the estimate's
    second, except under DDP on CUDA, whose estimate gives a bound (its step 2: a second
    set of bucket-sized buffers alive) and a floor (its step 3: one set): a real step 2 or 3
    of back-to-back steps must lie between them (each within 5%; the errors shown are
    against the bound and the floor), and steps 2 and 3 of the settled loop are compared
    with the floor."""
    r0 = results[0]
    reals = " ".join(
        "/".join(f"{s / MIB:.1f}" for s in r["steps"]) if "steps" in r else "failed"
        for r in results
    )
    if "est" not in r0 or "steps" not in r0:
        why = r0.get("est_error") or r0.get("error") or "no real step"
        return f"{name:34s} {mode:5s} {'-':>19s}  {reals}  {why}", None
    est, (g1, g2, g3) = r0["est"], r0["steps"]
    e1, e2, steady_est = est[0], est[min(1, len(est) - 1)], est[-1]
    if mode.endswith("-settled"):  # step 1's buckets went at the rebuild: the floor
        e2 = steady_est
    first, second, steady = error(e1, g1), error(e2, g2), error(steady_est, g3)
    if len(est) == 3 and not mode.endswith("-settled"):
        # a bound and a floor: the real later steps between them

        def between(real: int) -> bool:
            return steady_est * (1 - WITHIN) <= real <= e2 * (1 + WITHIN)

        later_ok = between(g2) and between(g3)
    else:
        later_ok = abs(second) <= WITHIN and abs(steady) <= WITHIN
    ok = abs(first) <= WITHIN and later_ok
    shown = "/".join(f"{e / MIB:.1f}" for e in est)
    return (
        f"{name:34s} {mode:11s} {shown:>26s}  {reals}  "
        f"{first:+7.2%} {second:+7.2%} {steady:+7.2%}  {'ok' if ok else 'MISS'}  "
        f"(collectives {r0.get('collective', 0) / MIB:.1f} MiB, estimate "
        f"{r0.get('est_seconds', 0):.1f} s)",
        ok,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the table here (rank 0)")
    parser.add_argument("--only", help="rows whose name contains this")
    parser.add_argument("--max-seconds", type=float, default=540.0)
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    device = f"cuda:{rank}"
    by_name = {w.name: w for w in zoo.workloads("cuda")}
    rows = [
        zoo.Row(by_name[n], precision=p, optimizer=by_name[n].optimizer, checkpointing=c)
        for n, p, c in ROWS
    ]
    lines = [
        f"# parallel_check: estimate(world_size={world}, parallel=...) vs real ranks",
        f"# device: {world} x {torch.cuda.get_device_name(0)}; torch {torch.__version__}; "
        f"python {platform.python_version()}; memlab_rs {memlab_rs.__version__}",
        "# peaks MiB: the estimate's steps (rank 0), then each rank's real steps 1/2/3; rank "
        "0's errors: step 1, step 2, step 3 against the estimate's step 1, step 2 and last "
        "step; ok: each within 5%, except DDP's real steps 2 and 3: between the estimate's "
        "floor (step 3) and bound (step 2), within 5%; ddp-settled: DDP with a "
        f"{SETTLE_SECONDS} s pause after step 1 (past NCCL's 100 ms watchdog sweep), its "
        "steps 2 and 3 against the floor",
    ]
    started = time.perf_counter()
    passed = total = 0
    for row in rows:
        for mode in MODES:
            name = row.name
            if args.only and args.only not in f"{name} {mode}":
                continue
            # Every rank decides together whether there is time for another row.
            late = torch.tensor([time.perf_counter() - started > args.max_seconds], device="cuda")
            dist.all_reduce(late, op=dist.ReduceOp.MAX)
            if late.item():
                lines.append(f"# stopped after {args.max_seconds:.0f} s")
                break
            try:
                mine = run_row(row, mode, world, rank, device)
            except Exception as exc:  # noqa: BLE001  the row says why
                mine = {"error": f"{type(exc).__name__}: {estimate_zoo._first_line(exc)}"}
                if rank == 0:
                    traceback.print_exc()
            gc.collect()
            results: list[Any] = [None] * world
            dist.all_gather_object(results, mine)
            if rank == 0:
                text, ok = line(name, mode, results)
                print(text, flush=True)
                lines.append(text)
                if ok is not None:
                    total += 1
                    passed += ok
    if rank == 0:
        lines.append(f"# within {WITHIN:.0%} on both steps: {passed} of {total} rows")
        print(lines[-1])
        if args.out:
            with open(args.out, "w") as f:
                f.write("\n".join(lines) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
