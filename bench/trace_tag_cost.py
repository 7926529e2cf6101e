"""What module and phase tagging costs: module calls per second of a 12-layer MLP's forward
and backward, without tags, with memlab_rs's ModuleTagger, and with torch's own
``torch.utils.module_tracker.ModuleTracker`` (the same hooks, tagging nothing), side by side.

The MLP is small (width 32, batch 8) so that the per-call cost shows, not the matmuls.
Run on CPU by default; ``--device cuda`` runs the model on the GPU (tags then also go to
``torch.cuda.memory._set_memory_metadata``, with the history recording on).

    python bench/trace_tag_cost.py [--device cuda] [--width 32] [--gpt2]

``--gpt2`` (CUDA, needs transformers) adds GPT-2 training steps (random weights, AdamW) at
batch 1x64 (CPU-bound: every per-call cost shows) and 8x512, with the CUDA history on,
without and with the tagger.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

from memlab_rs.trace.tags import ModuleTagger, cpu_tag_setter, cuda_tag_setter

LAYERS = 12


def mlp(width: int) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def module_calls(model: torch.nn.Module) -> int:
    return sum(1 for _ in model.modules())  # each module is called once per forward


def step_time(model, x, steps: int, repeats: int, sync) -> float:
    """Median seconds per forward+backward over ``repeats`` runs of ``steps`` steps."""
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            model(x).sum().backward()
        sync()
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description="module and phase tagging cost")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--gpt2", action="store_true")
    args = parser.parse_args()
    if args.gpt2:
        gpt2_steps()
        return

    device = torch.device(args.device)
    model = mlp(args.width).to(device)
    x = torch.randn(args.batch, args.width, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    history: contextlib.AbstractContextManager = contextlib.nullcontext()
    if device.type == "cuda":
        torch.cuda.memory._record_memory_history(max_entries=100_000)
        history = contextlib.ExitStack()
        history.callback(torch.cuda.memory._record_memory_history, enabled=None)
    calls = module_calls(model)
    step_time(model, x, 20, 1, sync)  # warm-up

    from torch.utils.module_tracker import ModuleTracker

    setters = [s for s in (cuda_tag_setter(), cpu_tag_setter()) if s is not None]
    variants = [
        ("no tags", contextlib.nullcontext),
        ("ModuleTagger(model)", lambda: ModuleTagger(model)),
        ("ModuleTagger(model, backward=False)", lambda: ModuleTagger(model, backward=False)),
        ("ModuleTagger() (class paths)", lambda: ModuleTagger()),
        ("torch ModuleTracker (no tags)", ModuleTracker),
    ]
    print(
        f"{LAYERS}-layer MLP, width {args.width}, batch {args.batch}, {device}: {calls} module "
        f"calls per forward; tags go to {len(setters)} recorder(s) "
        f"({', '.join(getattr(s, '__name__', str(s)) for s in setters) or 'none'})"
    )
    print(f"torch {torch.__version__}")
    print(f"{'':36} {'step (us)':>10} {'calls/s':>10} {'+us/call':>9} {'ratio':>6}")
    base = None
    with history:
        for name, make in variants:
            with make():
                seconds = step_time(model, x, args.steps, args.repeats, sync)
            if base is None:
                base = seconds
            extra = (seconds - base) / calls * 1e6
            print(
                f"{name:36} {seconds * 1e6:10.1f} {calls / seconds:10.0f} {extra:9.2f} "
                f"{seconds / base:6.2f}"
            )


def gpt2_steps(steps: int = 15, rounds: int = 6) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12)).cuda()
    opt = torch.optim.AdamW(model.parameters())

    def step(ids):
        model(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    variants = [
        ("no tags", contextlib.nullcontext),
        ("ModuleTagger(model)", lambda: ModuleTagger(model)),
        ("backward=False", lambda: ModuleTagger(model, backward=False)),
    ]
    print(f"GPT-2 (12 layers), AdamW, CUDA history on; {sum(1 for _ in model.modules())} modules")
    print(f"median step over {steps} steps, best of {rounds} interleaved rounds")
    print(f"{'':12}" + "".join(f"{name:>22}" for name, _ in variants))
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    try:
        for batch, seq in ((1, 64), (8, 512)):
            ids = torch.randint(0, 50257, (batch, seq), device="cuda")
            best = {name: float("inf") for name, _ in variants}
            for _ in range(rounds):  # interleaved, so that drift hits every variant alike
                for name, make in variants:
                    with make():
                        for _ in range(3):
                            step(ids)
                        times = []
                        for _ in range(steps):
                            torch.cuda.synchronize()
                            start = time.perf_counter()
                            step(ids)
                            torch.cuda.synchronize()
                            times.append(time.perf_counter() - start)
                    best[name] = min(best[name], statistics.median(times))
            base = best["no tags"]
            cells = "".join(
                f"{best[name] * 1e3:13.2f} ms {best[name] / base:5.3f}" for name, _ in variants
            )
            print(f"{batch}x{seq:<10}{cells}")
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


if __name__ == "__main__":
    main()
