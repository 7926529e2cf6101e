"""Line profiler overhead: memlab_rs vs pytorch_memlab 0.3.2 vs no profiler, side by side.

1. CPU: with the profiler enabled on one function, code that is NOT profiled: a tight
   pure-Python loop (target: at most 1.05x its unprofiled time, met with sys.monitoring on
   3.12+), a call-heavy loop (a function call per iteration; the called function doing a
   little arithmetic, then nothing) and a CPU training step of the bundled TinyGPT. On
   3.9-3.11 the interpreter runs in tracing mode and calls the C trace function at every
   call and return of every frame, so these are the figures the guide's "Cost" states;
   they are timed in this thread's CPU time (time.thread_time, one torch thread), which
   other processes on a shared machine do not inflate.
2. Cost of one profiled line (a function of 20 lines, called in a loop).
3. GPU (when CUDA is available), the workloads of CONTRIBUTING.md: GPT-2 (124M) at batch 8x512
   and 1x64, ResNet-50 at 64x3x224x224; profiling the training step ("step") and also the
   repeated block's forward ("step+block"). Targets: 1.02x and 1.05x.

Variants run alternately, round after round, and we print medians and their ratio to the
unprofiled median (the machines drift by several percent between runs).

    python bench/line_profiler_overhead.py [--rounds 11] [--steps 5] [--skip-gpu]
                                           [--unprofiled-only]
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import platform
import statistics
import sys
import time
import warnings

import torch

import memlab_rs

try:
    from pytorch_memlab import LineProfiler as PeerProfiler
except ImportError:  # the peer is optional here
    PeerProfiler = None

HAVE_CUDA = torch.cuda.is_available()


def unrelated_loop(n: int) -> int:
    total = 0
    for i in range(n):
        total += (i * i) % 7
    return total


def square_mod(i: int) -> int:
    return (i * i) % 7


def unrelated_calls(n: int) -> int:
    """The tight loop with a function call per iteration."""
    total = 0
    for i in range(n):
        total += square_mod(i)
    return total


def same(i: int) -> int:
    return i


def unrelated_empty_calls(n: int) -> int:
    """A call per iteration to a function that does nothing: the call is all the work."""
    total = 0
    for i in range(n):
        total += same(i)
    return total


def profiled_elsewhere(x):
    y = x + 1
    return y


def twenty_lines(x):
    a = x + 1
    b = a + 1
    c = b + 1
    d = c + 1
    e = d + 1
    f = e + 1
    g = f + 1
    h = g + 1
    i = h + 1
    j = i + 1
    k = j + 1
    m = k + 1
    n = m + 1
    o = n + 1
    p = o + 1
    q = p + 1
    r = q + 1
    s = r + 1
    t = s + 1
    return t


@contextlib.contextmanager
def ours(*functions, device=None):
    lp = memlab_rs.LineProfiler(*functions, device=device)
    with lp:
        yield lp


@contextlib.contextmanager
def peer(*functions):
    with contextlib.redirect_stdout(io.StringIO()):  # it prints when CUDA is missing
        lp = PeerProfiler(*functions, target_gpu=0)
        lp.enable()
    try:
        yield lp
    finally:
        lp.disable()


@contextlib.contextmanager
def nothing():
    yield None


def alternate(variants: dict, run, rounds: int, clock=time.perf_counter) -> dict[str, float]:
    """Median seconds of one `run()` under each variant, the variants taking turns.

    `run` returns a list of timings (one per step) or None to be timed as a whole by
    `clock`.
    """
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        names = list(variants)
        names = names[r % len(names) :] + names[: r % len(names)]  # rotate the order
        for name in names:
            with variants[name]():
                start = clock()
                steps = run()
                elapsed = clock() - start
            times[name] += steps if isinstance(steps, list) else [elapsed]
    return {name: statistics.median(t) for name, t in times.items()}


def show(title: str, medians: dict[str, float], per: float = 1.0, unit: str = "ms"):
    base = medians["none"]
    print(f"\n{title}")
    for name, value in medians.items():
        print(f"  {name:<28} {value / per * 1e3:9.3f} {unit}   {value / base:6.3f}x")


def cpu_unrelated(rounds: int):
    device = "cuda" if HAVE_CUDA else "cpu"
    variants = {
        "none": nothing,
        "memlab_rs": lambda: ours(profiled_elsewhere, device=device),
    }
    if PeerProfiler is not None and HAVE_CUDA:
        variants["pytorch_memlab"] = lambda: peer(profiled_elsewhere)
    medians = alternate(variants, lambda: unrelated_loop(400_000), rounds * 2, time.thread_time)
    show("1a. unprofiled tight pure-Python loop (400k iterations), profiler on another "
         "function (thread CPU time)", medians)
    medians = alternate(variants, lambda: unrelated_calls(200_000), rounds * 2, time.thread_time)
    show("1b. unprofiled call-heavy loop (200k iterations, a call each), profiler on another "
         "function (thread CPU time)", medians)
    medians = alternate(
        variants, lambda: unrelated_empty_calls(200_000), rounds * 2, time.thread_time
    )
    show("1c. the same, the function called doing nothing (thread CPU time)", medians)
    if HAVE_CUDA:
        return  # the step below is the CPU's; section 3 has the GPU workloads
    from memlab_rs.models import TinyGPT

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the whole step on this thread: thread CPU time sees it all
    torch.manual_seed(0)
    model = TinyGPT(vocab=1000, dim=128, layers=4, heads=4, context=128)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1000, (2, 64))

    def train_step():
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        train_step()
    medians = alternate(variants, train_step, rounds * 2, time.thread_time)
    torch.set_num_threads(threads)
    show("1d. unprofiled CPU training step, TinyGPT(dim 128, 4 layers) 2x64 AdamW, profiler "
         "on another function (thread CPU time)", medians)


def per_line_cost(rounds: int):
    device = "cuda" if HAVE_CUDA else "cpu"
    x = torch.ones(4, device=device)
    calls = 200
    variants = {"none": nothing, "memlab_rs": lambda: ours(twenty_lines, device=device)}
    if PeerProfiler is not None and HAVE_CUDA:
        variants["pytorch_memlab"] = lambda: peer(twenty_lines)

    def run():
        for _ in range(calls):
            twenty_lines(x)

    medians = alternate(variants, run, rounds)
    base = medians["none"]
    print(f"\n2. cost per profiled line ({device}; 21 line events per call)")
    for name, value in medians.items():
        extra = (value - base) / (calls * 21) * 1e6
        print(f"  {name:<28} {value / calls * 1e6:9.1f} us/call   +{extra:6.2f} us/line")


def gpu_workloads(rounds: int, steps: int):
    from torchvision.models import resnet50
    from torchvision.models.resnet import Bottleneck
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    dev = torch.device("cuda:0")

    def gpt2(batch, tokens):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12)).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, 50257, (batch, tokens), device=dev)

        def train_step():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        return train_step, inspect.unwrap(GPT2Block.forward), model

    def resnet():
        torch.manual_seed(0)
        model = resnet50().to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(64, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (64,), device=dev)

        def train_step():
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        return train_step, inspect.unwrap(Bottleneck.forward), model

    workloads = {
        "GPT-2 8x512": lambda: gpt2(8, 512),
        "GPT-2 1x64": lambda: gpt2(1, 64),
        "ResNet-50 64x3x224x224": resnet,
    }
    for title, build in workloads.items():
        measure_workload(title, *build(), rounds, steps)
        torch.cuda.empty_cache()


def measure_workload(title, step, block, model, rounds, steps):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    variants = {
        "none": nothing,
        "memlab_rs step": lambda: ours(step),
        "memlab_rs step+block": lambda: ours(step, block),
    }
    if PeerProfiler is not None:
        variants["pytorch_memlab step"] = lambda: peer(step)
        variants["pytorch_memlab step+block"] = lambda: peer(step, block)

    def run():
        timings = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            torch.cuda.synchronize()
            timings.append(time.perf_counter() - start)
        return timings

    medians = alternate(variants, run, rounds)
    show(f"3. {title}: training step (median of {rounds * steps} steps)", medians,
         unit="ms/step")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--skip-gpu", action="store_true")
    parser.add_argument(
        "--unprofiled-only", action="store_true", help="section 1 only (the guide's Cost)"
    )
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    gpu = torch.cuda.get_device_name(0) if HAVE_CUDA else "no GPU"
    print(f"Python {platform.python_version()}, torch {torch.__version__}, {gpu}")
    hook = "sys.monitoring" if sys.version_info >= (3, 12) else "C trace function"
    print(f"memlab_rs hook: {hook}; pytorch_memlab: {'yes' if PeerProfiler else 'missing'}")
    if HAVE_CUDA:
        with memlab_rs.LineProfiler(twenty_lines) as lp:
            torch.ones(1, device="cuda")
            twenty_lines(torch.ones(1, device="cuda"))
            why = memlab_rs._core._cuda_direct_why_not(0)
            print(f"memlab_rs CUDA statistics read from: {lp.stats_reader} {why or ''}")
    cpu_unrelated(args.rounds)
    if args.unprofiled_only:
        return
    per_line_cost(args.rounds)
    if HAVE_CUDA and not args.skip_gpu:
        gpu_workloads(args.rounds, args.steps)
    if HAVE_CUDA:
        compared, mismatched, inconclusive = memlab_rs._core._cuda_direct_checks(0)
        print(f"\nmemlab_rs direct reader checked against torch: {compared} compared, "
              f"{mismatched} mismatched, {inconclusive} inconclusive")
        notice = memlab_rs._core._cuda_direct_notice(0)
        if notice:
            print(notice)


if __name__ == "__main__":
    main()
