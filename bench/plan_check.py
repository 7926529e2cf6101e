"""``memlab_rs.plan``'s answers checked by real steps (issue 24): for each row of a plan (the
baseline and each choice changed alone: bf16, autocast bf16, checkpointing, SGD), the
largest size the plan says fits the budget is run for real, and so is one size more.

What is compared: the plan's budget against ``torch.cuda.max_memory_reserved()`` of real
training steps (three: the first makes the optimizer state), each size in a Python process
of its own, as a user's training starts (``real_reserved`` says why). A row passes
when the real peak at the answer is within the budget and the real peak one size more is
over it: the answer fits, and one size up does not. The estimated reserved peaks at both
sizes are printed beside the real ones.

Workloads (random weights, nothing downloaded): an MLP of 6 blocks (2048 wide), the
bundled TinyGPT (memlab_rs.models), torchvision's ResNet-18 at 64x64, transformers' GPT-2
124M at 256 tokens. Each gets its own budget, small enough to search quickly.

Run (GPU machine): ``python bench/plan_check.py --out bench/results/plan_check_h200.txt``;
``--only NAME`` keeps the workloads whose name has it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import memlab_rs
from memlab_rs.estimation.checkpointing import enable_checkpointing
from memlab_rs.estimation.what_if import precision_settings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fresh_process  # noqa: E402


@dataclass
class Workload:
    name: str
    build: Callable[[], nn.Module]
    make_inputs: Callable[[int], Any]
    size: int
    budget: str


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(2048, 2048), nn.GELU()) for _ in range(6)]
    return nn.Sequential(*blocks, nn.Linear(2048, 16))


def _tinygpt() -> nn.Module:
    torch.manual_seed(0)
    return memlab_rs.models.TinyGPT(vocab=1000, dim=256, layers=4, heads=4, context=128)


def _resnet18() -> nn.Module | None:
    try:
        import torchvision
    except ImportError:
        return None
    torch.manual_seed(0)
    return torchvision.models.resnet18()


def _gpt2() -> nn.Module | None:
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return None
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12)).train()


def _ids(tokens: int, vocab: int) -> Callable[[int], Any]:
    return lambda n: torch.randint(0, vocab, (n, tokens))


def _gpt2_inputs(n: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 50257, (n, 256))
    return {"input_ids": ids, "labels": ids}


WORKLOADS = [
    Workload("mlp", _mlp, lambda n: torch.randn(n, 2048), 64, "1GiB"),
    Workload("tinygpt", _tinygpt, _ids(128, 1000), 8, "2GiB"),
    Workload("resnet18", _resnet18, lambda n: torch.randn(n, 3, 64, 64), 32, "3GiB"),  # type: ignore[arg-type]
    Workload("gpt2", _gpt2, _gpt2_inputs, 4, "10GiB"),  # type: ignore[arg-type]
]


def _sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=1e-2, momentum=0.9)


def _adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3)


#: By the names the plan's rows give them (the baseline: the class's name).
OPTIMIZERS = {"AdamW": _adamw, "SGD (momentum)": _sgd}


def _on_cuda(value: Any, dtype: torch.dtype | None) -> Any:
    if isinstance(value, dict):
        return {k: _on_cuda(v, dtype) for k, v in value.items()}
    if dtype is not None and value.is_floating_point():
        value = value.to(dtype)
    return value.to("cuda")


def real_reserved(w: Workload, row: dict[str, Any], n: int, steps: int = 3) -> int | str:
    """max_memory_reserved() of `steps` real steps of the row's settings at size `n`, in a
    fresh Python process, as a user's training starts ("OOM" if the GPU itself ran out).

    A fresh process, because what a step reserves depends on the addresses the CUDA driver
    gives its segments: where two free blocks are the same size the caching allocator takes
    the lower address, and in a process that has freed segments before (``empty_cache``
    after another run) the driver reuses their ranges, so the same step reserved up to 18%
    more or less there (an H200: a VGG-like stack 1446 and 1704 MiB in two such runs) than
    in a process of its own, which is what the estimate models."""
    row_json = json.dumps({k: row[k] for k in ("precision", "checkpointing", "optimizer")})
    answer = fresh_process.last_line("plan_check", "_fresh", w.name, row_json, n, steps)
    return answer if answer == "OOM" else int(answer)


def _fresh(name: str, row_json: str, n: int, steps: int) -> None:
    """The body of `real_reserved`'s process: prints the peak reserved, or OOM."""
    (w,) = [w for w in WORKLOADS if w.name == name]
    try:
        _steps(w, json.loads(row_json), n, steps)
        print(int(torch.cuda.max_memory_reserved()))
    except torch.OutOfMemoryError:
        print("OOM")


def _steps(w: Workload, row: dict[str, Any], n: int, steps: int) -> None:
    settings = precision_settings(row["precision"])
    dtype, autocast = settings.get("dtype"), settings.get("autocast")
    model = w.build()
    inputs = w.make_inputs(n)
    if dtype is not None:
        model = model.to(dtype)
    model = model.to("cuda")
    if row["checkpointing"]:
        enable_checkpointing(model)
    inputs = _on_cuda(inputs, dtype)
    opt = OPTIMIZERS[row["optimizer"]](model.parameters())
    scaler = torch.amp.GradScaler("cuda") if settings.get("grad_scaler") else None
    for _ in range(steps):
        with torch.autocast("cuda", dtype=autocast, enabled=autocast is not None):
            out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
            loss = out.loss if hasattr(out, "loss") else out.sum()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)
        del out, loss
    torch.cuda.synchronize()


def check(w: Workload, log: Callable[[str], None]) -> list[bool]:
    """Plan `w`, then run each row's answer and one more; a pass/fail per row."""
    model = w.build()
    if model is None:
        log(f"{w.name}: skipped (its library is not installed)")
        return []
    started = time.perf_counter()
    p = memlab_rs.plan(model, w.make_inputs, w.size, w.budget, device="cuda:0", sizes=[],
                       optimizer=torch.optim.AdamW, optimizer_kwargs={"lr": 1e-3},
                       precisions=["bf16", "amp-bf16"],
                       optimizers={"SGD (momentum)": _sgd})  # fmt: skip
    log(f"{w.name}: plan in {time.perf_counter() - started:.1f} s, budget {w.budget}")
    log(str(p))
    head = ("row", "n", "est n", "real n", "est n+1", "real n+1")
    log(f"  {head[0]:<44} " + " ".join(f"{h:>9}" for h in head[1:]) + "  verdict")
    verdicts = []
    mib = 1 << 20
    for row in p.rows:
        n = row["largest_size"]
        ckpt = "ckpt" if row["checkpointing"] else "no-ckpt"
        label = f"{row['axis']}: {row['precision']}, {ckpt}, {row['optimizer']}"
        if row["error"] is not None or not n:
            log(f"  {label:<44} no answer: {row['error'] or 'nothing fits'}")
            continue
        settings = precision_settings(row["precision"])
        est = [
            memlab_rs.estimate(
                model, w.make_inputs(k), optimizer=OPTIMIZERS[row["optimizer"]],
                device="cuda:0", checkpointing=row["checkpointing"], **settings,
            ).peak_reserved
            for k in (n, n + 1)
        ]  # fmt: skip
        real = [real_reserved(w, row, k) for k in (n, n + 1)]
        budget = p.budget
        fits = isinstance(real[0], int) and real[0] <= budget
        over = real[1] == "OOM" or (isinstance(real[1], int) and real[1] > budget)
        verdicts.append(fits and over)
        shown = [f"{r / mib:.0f}" if isinstance(r, int) else r for r in real]
        verdict = "n does not fit" if not fits else ("n+1 fits too" if not over else "pass")
        cells = (n, f"{est[0] / mib:.0f}", shown[0], f"{est[1] / mib:.0f}", shown[1])
        log(f"  {label:<44} " + " ".join(f"{c:>9}" for c in cells) + f"  {verdict}")
    return verdicts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="")
    parser.add_argument("--out")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("plan_check needs a GPU", file=sys.stderr)
        return 2
    lines: list[str] = []

    def log(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    props = torch.cuda.get_device_properties(0)
    log(f"memlab_rs.plan checked by real steps on {props.name}, torch {torch.__version__}")
    log("reserved peaks in MiB; n: the plan's largest size under the budget")
    passed = total = 0
    for w in WORKLOADS:
        if args.only in w.name:
            verdicts = check(w, log)
            passed += sum(verdicts)
            total += len(verdicts)
    log(f"{passed} of {total} answers fit and one size more does not")
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
