"""Courtesy speed on a GPT-2 (124M) training state (parameters, grads, AdamW state), side by
side: the tensor-moving ``Courtesy().yield_memory()/restore()``, a Courtesy region's
``pause``/``resume`` (host buffers pinned ahead, and pinned at the first pause), and
torch_memory_saver's pause/resume (hook mode "torch", pinned CPU backup), each against the
pinned host bandwidth measured in the same process. Each variant runs in a fresh process,
so that its first pause is a first; the state is built the same way in each (inside the
region where there is one: grads made before the first step, so that autograd's threads
only accumulate into them).

    python bench/courtesy_bandwidth.py [--rounds 4] [--variants courtesy,region,...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from contextlib import nullcontext

import torch

VARIANTS = ("courtesy", "region", "region-pin-at-pause", "torch_memory_saver")


def gpt2_state(dev, context):
    from transformers import GPT2Config, GPT2LMHeadModel

    with context:
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12)).to(dev)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        ids = torch.randint(0, 50257, (4, 256), device=dev)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()  # grads are kept: a preemption can come before zero_grad
    torch.cuda.synchronize()
    return model, optimizer


def state_bytes(model, optimizer) -> int:
    seen, total = set(), 0
    for p in model.parameters():
        for t in [p, p.grad, *optimizer.state[p].values()]:
            if torch.is_tensor(t) and t.is_cuda and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start, result


def pinned_bandwidth(nbytes, dev):
    """Best GB/s of a pinned copy of `nbytes` to the host and to the device (of 5). Run
    before the state is built: its empty_cache must not free a region's segments."""
    buffers = (
        torch.empty(nbytes, dtype=torch.uint8, pin_memory=True),
        torch.empty(nbytes, dtype=torch.uint8, device=dev),
    )

    def copy(to, source):
        return lambda: to.copy_(source, non_blocking=True)

    d2h = min(timed(copy(*buffers))[0] for _ in range(5))
    h2d = min(timed(copy(*reversed(buffers)))[0] for _ in range(5))
    del buffers
    torch.cuda.empty_cache()
    return nbytes / d2h / 1e9, nbytes / h2d / 1e9


def wait_for_pinning():
    import threading

    while any(t.name == "memlab-rs-pin" for t in threading.enumerate()):
        time.sleep(0.02)


def run_variant(variant: str, rounds: int) -> dict:
    from memlab_rs import Courtesy

    dev = torch.device("cuda:0")
    out: dict = {"variant": variant, "pause": [], "resume": []}
    # GPT-2 (124M)'s state with AdamW: 1.99 GB (measured below as state_bytes).
    out["pinned_gb_s"] = pinned_bandwidth(1_990_000_000, dev)
    if variant == "courtesy":
        model, optimizer = gpt2_state(dev, nullcontext())
        courtesy = Courtesy()
        pause = lambda: courtesy.yield_memory().moved_bytes  # noqa: E731
        resume = lambda: courtesy.restore().restored_bytes  # noqa: E731
    elif variant.startswith("region"):
        region = Courtesy.region("train", prepare_host=variant == "region")
        model, optimizer = gpt2_state(dev, region)
        started = time.perf_counter()
        wait_for_pinning()
        out["waited_for_pinning_s"] = time.perf_counter() - started
        from memlab_rs import _core

        seconds, nbytes, _ = _core.courtesy.region_counters()
        out["pinned_ahead"] = {"seconds": seconds, "bytes": nbytes}
        out["region_bytes"] = region.state()["mapped_bytes"]
        reports = out["reports"] = []

        def pause():
            report = Courtesy.pause("train")
            reports.append(("pause", report.seconds, report.map_seconds))
            return report.moved_bytes

        def resume():
            report = Courtesy.resume("train")
            reports.append(("resume", report.seconds, report.map_seconds))
            return report.moved_bytes

        out["snapshot_s"] = min(timed(region.live_ranges)[0] for _ in range(3))
    elif variant == "torch_memory_saver":
        from torch_memory_saver import torch_memory_saver as tms

        tms.hook_mode = "torch"
        # Its region stays entered to the end: with torch 2.11, leaving it lets torch free
        # the pool's cached segments, and its free function then ends the process ("only
        # support interesting region"); the child leaves with os._exit for the same reason.
        region = tms.region(tag="train", enable_cpu_backup=True)
        region.__enter__()
        model, optimizer = gpt2_state(dev, nullcontext())
        pause = lambda: tms.pause("train")  # noqa: E731
        resume = lambda: tms.resume("train")  # noqa: E731
    else:
        raise SystemExit(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")
    out["state_bytes"] = state_bytes(model, optimizer)
    probe = {n: p.detach()[:4].clone() for n, p in list(model.named_parameters())[:3]}
    for _ in range(rounds):
        free_before = torch.cuda.mem_get_info(dev)[0]
        seconds, moved = timed(pause)
        freed = torch.cuda.mem_get_info(dev)[0] - free_before
        out["pause"].append({"seconds": seconds, "moved": moved, "freed": freed})
        seconds, moved = timed(resume)
        out["resume"].append({"seconds": seconds, "moved": moved})
    out["intact"] = all(
        torch.equal(dict(model.named_parameters())[n][:4], v) for n, v in probe.items()
    )
    out["pinned_gb_s"] = pinned_bandwidth(out["state_bytes"], dev)
    return out


def row(name, runs, key, pinned):
    """First and later (median) calls: ms, the state's GB/s, and the GB/s of the bytes the
    call copied (a region also keeps the other live blocks of its segments: the last
    step's inputs and outputs, workspaces), each with its share of the pinned copy's."""
    first, later = runs[0], runs[1:]
    text = []
    for label, items in (("first", [first]), ("later", later)):
        if not items:
            continue
        seconds = statistics.median(r["seconds"] for r in items)
        moved = statistics.median(r["moved"] or 0 for r in items)
        rate = key / seconds / 1e9
        cell = f"{label} {seconds * 1e3:7.1f} ms {rate:5.1f} GB/s ({rate / pinned:4.0%})"
        if moved:
            copied = moved / seconds / 1e9
            cell += f", copied {moved / 1e9:.2f} GB at {copied:.1f} GB/s ({copied / pinned:4.0%})"
        text.append(cell)
    return f"  {name:9s} " + "   ".join(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # a child process's one
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.rounds)), flush=True)
        if args.variant == "torch_memory_saver":
            os._exit(0)  # see run_variant
        return
    if not torch.cuda.is_available():
        print("courtesy_bandwidth: needs a CUDA GPU (Courtesy moves GPU memory); skipped")
        return
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, python "
          f"{sys.version.split()[0]}; GB/s: the state's bytes over the wall time, then the "
          "bytes the call copied over it (where it says); (%): of the pinned copy's GB/s "
          "measured in the same process; each variant a fresh process")  # fmt: skip
    for variant in args.variants.split(","):
        child = subprocess.run(
            [sys.executable, __file__, "--variant", variant, "--rounds", str(args.rounds)],
            capture_output=True,
            text=True,
        )
        if child.returncode != 0:
            print(f"{variant}: failed (rc {child.returncode}): {child.stderr.strip()[-1500:]}")
            continue
        r = json.loads(child.stdout.strip().splitlines()[-1])
        d2h, h2d = r["pinned_gb_s"]
        state = r["state_bytes"]
        extra = ""
        if "region_bytes" in r:
            ahead = r["pinned_ahead"]
            extra = (f"; region {r['region_bytes'] / 1e9:.2f} GB, host buffers pinned ahead "
                     f"{ahead['bytes'] / 1e9:.2f} GB in {ahead['seconds']:.2f} s "
                     "(background)")  # fmt: skip
        print(f"{variant}: state {state / 1e9:.2f} GB, pinned copy {d2h:.1f} GB/s to host, "
              f"{h2d:.1f} to device; contents intact: {r['intact']}{extra}")  # fmt: skip
        if "reports" in r:
            inner = ", ".join(f"{a} {s * 1e3:.1f} (map {m * 1e3:.1f})" for a, s, m in r["reports"])
            print(f"  inside the Rust core (ms): {inner}; the pool's snapshot "
                  f"{r['snapshot_s'] * 1e3:.1f} ms")  # fmt: skip
        print(row("pause", r["pause"], state, d2h))
        print(row("resume", r["resume"], state, h2d))
        freed = [p["freed"] for p in r["pause"]]
        print(
            f"  device memory freed by each pause: {', '.join(f'{f / 1e9:.2f}' for f in freed)} GB"
        )


if __name__ == "__main__":
    main()
