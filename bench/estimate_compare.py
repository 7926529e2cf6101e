"""memlab_rs.estimate against the other ways to guess a training step's memory, side by side.

For GPT-2 124M (transformers, 8 x 512 tokens, AdamW) and ResNet-50 (torchvision, batch 64,
SGD with momentum), with random weights:

- ours: ``memlab_rs.estimate`` (model built on the meta device, nothing allocated; timed
  again for the model built with random CPU weights);
- accelerate: ``accelerate estimate-memory``'s "Training using Adam" figure, computed as its
  source computes it (accelerate/commands/estimate.py, ``estimate_training_usage``, float32:
  the maximum of model, gradients, optimizer = 2 x model and step = 4 x model, so 4 x the
  parameter and buffer bytes; batch size and activations are not part of it);
- MemTracker: ``torch.distributed._tools.mem_tracker.MemTracker`` under ``FakeTensorMode``
  (its "peak" snapshot's total over two steps; fake CUDA tensors need a GPU for backward, so
  without one it runs on fake CPU tensors);
- real: ``torch.cuda.max_memory_allocated()`` of a real first and second step (peak stats
  reset before each), on a GPU only.

Each estimate is shown as bytes and as a ratio to the real peak, with its time.
Run: ``python bench/estimate_compare.py`` (GPU machine: everything; elsewhere: no real column).
"""

from __future__ import annotations

import gc
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F

import memlab_rs

GPT2_BATCH, GPT2_TOKENS, RESNET_BATCH = 8, 512, 64


def gpt2_workload(build_device: str | None) -> dict[str, Any] | None:
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return None
    cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12)
    with torch.device(build_device or "cpu"):
        model = GPT2LMHeadModel(cfg)
    model.train()
    ids = torch.randint(0, cfg.vocab_size, (GPT2_BATCH, GPT2_TOKENS))
    return {
        "name": f"GPT-2 124M {GPT2_BATCH}x{GPT2_TOKENS} AdamW",
        "model": model,
        "inputs": {"input_ids": ids, "labels": ids},
        "targets": None,
        "loss_fn": None,
        "optimizer": torch.optim.AdamW,
        "optimizer_kwargs": {"lr": 1e-4},
    }


def resnet50_workload(build_device: str | None) -> dict[str, Any] | None:
    try:
        import torchvision
    except ImportError:
        return None
    with torch.device(build_device or "cpu"):
        model = torchvision.models.resnet50()
    model.train()
    return {
        "name": f"ResNet-50 batch {RESNET_BATCH} SGD momentum",
        "model": model,
        "inputs": torch.randn(RESNET_BATCH, 3, 224, 224),
        "targets": torch.randint(0, 1000, (RESNET_BATCH,)),
        "loss_fn": F.cross_entropy,
        "optimizer": torch.optim.SGD,
        "optimizer_kwargs": {"lr": 0.1, "momentum": 0.9},
    }


WORKLOADS = (gpt2_workload, resnet50_workload)


def ours(w: dict[str, Any], device: str = "cuda:0") -> memlab_rs.MemoryEstimate:
    return memlab_rs.estimate(
        w["model"],
        w["inputs"],
        optimizer=w["optimizer"],
        optimizer_kwargs=w["optimizer_kwargs"],
        loss_fn=w["loss_fn"],
        targets=w["targets"],
        device=device,
    )


def accelerate_rule(model: torch.nn.Module) -> int:
    """accelerate's float32 "Training using Adam": 4 x (parameter + buffer bytes), each
    tensor once (its compute_module_sizes walks named_parameters, which skips tied ones)."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[id(t)] = t.numel() * t.element_size()
    return 4 * sum(seen.values())


def _move(value: Any, device: str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _move(v, device) for k, v in value.items()}
    return value


def _loss(w: dict[str, Any], out: Any, targets: Any) -> torch.Tensor:
    if w["loss_fn"] is not None:
        return w["loss_fn"](out, targets)
    return out.loss


def _forward(w: dict[str, Any], model, inputs) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


def memtracker_fake(make, device: str) -> tuple[int | None, float, str]:
    """MemTracker's peak under FakeTensorMode over two steps, seconds, and an error if any."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    started = time.perf_counter()
    try:
        with FakeTensorMode(), torch.device(device):
            w = make(device)  # the model, and (under this device) the inputs, on it
            model = w["model"]
            inputs, targets = _move(w["inputs"], device), _move(w["targets"], device)
            opt = w["optimizer"](model.parameters(), **w["optimizer_kwargs"])
            tracker = MemTracker()
            tracker.track_external(model, opt)
            with tracker as mt:
                for i in range(2):
                    _loss(w, _forward(w, model, inputs), targets).backward()
                    opt.step()
                    opt.zero_grad()
                    if i == 0:
                        mt.reset_mod_stats()  # its documented way to track a second step
            peak = mt.get_tracker_snapshot("peak")
        total = max(v["Total"] for v in peak.values())
        return total, time.perf_counter() - started, ""
    except Exception as error:  # reported in the table, not hidden
        return None, time.perf_counter() - started, f"{type(error).__name__}: {error}"[:120]


def real_steps(w: dict[str, Any]) -> dict[str, int]:
    """max_memory_allocated of a real first and second step, then per phase on a third."""
    torch.cuda.empty_cache()
    result = _measure(w)
    w["model"] = None
    gc.collect()
    torch.cuda.empty_cache()
    return result


def _measure(w: dict[str, Any]) -> dict[str, int]:
    model = w["model"].to("cuda")
    inputs, targets = _move(w["inputs"], "cuda"), _move(w["targets"], "cuda")
    opt = w["optimizer"](model.parameters(), **w["optimizer_kwargs"])

    def step() -> None:
        out = _forward(w, model, inputs)
        loss = _loss(w, out, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    result: dict[str, int] = {"start": torch.cuda.memory_allocated()}
    for n in (1, 2):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        result[f"step {n}"] = torch.cuda.max_memory_allocated()
        result[f"reserved {n}"] = torch.cuda.max_memory_reserved()
    # Phases of a third step, to see where an estimate goes wrong.
    torch.cuda.reset_peak_memory_stats()
    out = _forward(w, model, inputs)
    loss = _loss(w, out, targets)
    result["forward 3"] = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    result["backward 3"] = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    opt.step()
    result["optimizer 3"] = torch.cuda.max_memory_allocated()
    opt.zero_grad(set_to_none=True)
    del out, loss  # as in step(): they live to the end of the step
    result["end"] = torch.cuda.memory_allocated()
    return result


def workspace_probe() -> dict[str, int]:
    """What the first matmul (cuBLAS) and first biased linear (cuBLASLt) on this thread
    leave allocated: their workspaces."""
    base = torch.cuda.memory_allocated()
    a = torch.ones(64, 64, device="cuda")
    (a @ a).sum().item()
    after_mm = torch.cuda.memory_allocated()
    F.linear(a, a, a[0]).sum().item()
    after_lt = torch.cuda.memory_allocated()
    return {"cublas": after_mm - base - 512 * 3, "cublaslt": after_lt - after_mm - 512 * 2}


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:10.1f}"


def main() -> None:
    gpu = torch.cuda.is_available()
    device_name = torch.cuda.get_device_name() if gpu else "no GPU"
    print(f"torch {torch.__version__}, memlab_rs {memlab_rs.__version__}, {device_name}")
    if gpu:
        print("workspace probe (bytes):", workspace_probe())
    for make in WORKLOADS:
        w = make("meta")
        if w is None:
            print(f"{make.__name__}: skipped (package missing)")
            continue
        est = ours(w)
        acc = accelerate_rule(w["model"])
        mt_peak, mt_s, mt_err = memtracker_fake(make, "cuda" if gpu else "cpu")
        print(f"\n== {w['name']} ==")
        print(est.text(), end="")
        print("ours: step peaks", est.step_peaks, "phase peaks", est.phase_peaks)
        print("ours: peak by category", est.peak_by_category, "workspaces", est.workspaces)
        real = None
        if gpu:
            real = real_steps(make(None))
            print("real:", real)
        truth = max(real["step 1"], real["step 2"]) if real else None
        # The same estimate for the model built with real (random) CPU weights: nothing of
        # their data is read, so it takes as long.
        with_weights = ours(make(None))
        assert with_weights.peak_allocated == est.peak_allocated
        rows = [
            ("memlab_rs.estimate (model on meta)", est.peak_allocated, est.seconds),
            (
                "memlab_rs.estimate (model with CPU weights)",
                est.peak_allocated,
                with_weights.seconds,
            ),
            ("accelerate estimate-memory rule", acc, 0.0),
            ("MemTracker + FakeTensorMode" + (f" ({mt_err})" if mt_err else ""), mt_peak, mt_s),
        ]
        print(f"{'predictor':<44} {'peak MiB':>10} {'/ real':>8} {'seconds':>8}")
        for name, value, seconds in rows:
            ratio = f"{value / truth:8.3f}" if truth and value else "       -"
            print(f"{name:<44} {mib(value)} {ratio} {seconds:8.2f}")
        if real:
            print(f"{'real max_memory_allocated (max of steps)':<44} {mib(truth)}    1.000")
            for n in (1, 2):
                err = est.step_peaks[n] / real[f"step {n}"] - 1
                print(
                    f"  step {n}: ours {est.step_peaks[n]} real {real[f'step {n}']} "
                    f"error {err * 100:+.2f}%"
                )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
