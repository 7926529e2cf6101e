"""The main job: train the bundled TinyGPT for a few steps and show where memory goes.

Run with ``python -m memlab_rs.demo`` (``make demo``). Uses CUDA when present, else CPU.
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from . import LineProfiler, MemReporter, MemTracker, estimate, memory_profiler, trace
from ._categories import CATEGORIES
from .models import Block, TinyGPT


def train_step(
    model: TinyGPT, optimizer: torch.optim.Optimizer, tokens: torch.Tensor
) -> torch.Tensor:
    """One training step on ``tokens`` (batch x (seq + 1)); returns the loss."""
    vocab = model.wte.num_embeddings
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=False)
    loss.backward()
    optimizer.step()
    return loss


def train_steps(
    model: TinyGPT,
    optimizer: torch.optim.Optimizer,
    steps: int,
    batch: int,
    seq: int,
    device: torch.device,
) -> float:
    """Run ``steps`` training steps on random tokens; returns the last loss."""
    vocab = model.wte.num_embeddings
    loss = torch.zeros(())
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (batch, seq + 1), device=device)
        loss = train_step(model, optimizer, tokens)
    return float(loss.detach())  # float() of a tensor that requires grad warns


def train_steps_keeping_logits(
    model: TinyGPT, optimizer: torch.optim.Optimizer, batch: int, seq: int, device: torch.device
) -> torch.Tensor:
    """One training step that keeps its logits, as a loop that logs them would."""
    vocab = model.wte.num_embeddings
    tokens = torch.randint(0, vocab, (batch, seq + 1), device=device)
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=False)
    loss.backward()
    optimizer.step()
    return logits.detach()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)

    torch.manual_seed(0)
    model = TinyGPT().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = train_steps(model, optimizer, args.steps, batch=8, seq=64, device=device)
    print(f"memlab_rs demo: TinyGPT trained {args.steps} steps on {device}, loss {loss:.3f}\n")

    reporter = MemReporter(model)
    reporter.add_optimizer(optimizer)
    print("== MemReporter: every tensor, each storage counted once ==")
    reporter.report(device=device)
    print("\n== The five largest tensors ==")
    reporter.report(device=device, sort_by="size", top=5)

    print("\n== LineProfiler: one more step, line by line (the step and each Block) ==")
    with LineProfiler(train_step, Block.forward, device=device) as profiler:
        train_steps(model, optimizer, 1, batch=8, seq=64, device=device)
    profiler.print_stats(columns=("active_bytes.all.peak", "allocated_bytes.all.allocated"))

    print("\n== trace: what was alive at the peak of one more step, by line and by module ==")
    with trace.Tracer(device=device, model=model, tag_modules=True) as tracer:
        train_steps(model, optimizer, 1, batch=8, seq=64, device=device)
    result = tracer.result
    assert result is not None  # set by the with block's exit
    result.report_stats()
    print()
    print(result.module_text(), end="")

    print("\n== memory_profiler: the training monitor, every iteration (here: two) ==")
    with memory_profiler(model, print_period=2, optimizer=optimizer, device=device) as monitor:
        for _ in range(2):
            train_steps(model, optimizer, 1, batch=8, seq=64, device=device)
            monitor.record_stats()
    row = monitor.rows()[-1]
    parts = ", ".join(f"{c} {row[c] / 2**20:.1f}" for c in CATEGORIES)
    print(f"peak allocated {row['peak_allocated'] / 2**20:.1f} MiB = {parts} (MiB)")

    print("\n== MemTracker: which tensors one more step left behind ==")
    with tempfile.TemporaryDirectory() as folder:
        tracker = MemTracker(path=folder + "/", device=device, model=model)
        tracker.track()
        kept = train_steps_keeping_logits(model, optimizer, batch=8, seq=64, device=device)
        for change in tracker.track().rows:
            print(change.line.rstrip())
        del kept

    print("\n== estimate: a fresh TinyGPT's step on fake tensors (zero_grad(set_to_none=True)) ==")
    tokens = torch.zeros(8, 64, dtype=torch.long)
    print(estimate(TinyGPT(), tokens, optimizer=torch.optim.AdamW, device=device))


if __name__ == "__main__":
    main()
