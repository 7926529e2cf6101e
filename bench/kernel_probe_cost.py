"""What measuring the convolutions on the device costs an estimate: the same estimates with
``measure_kernels=True`` and ``False`` side by side, in one process.

For torchvision's ResNet-18 and ResNet-50 (random weights, SGD with momentum) at two batch
sizes, on the device given (``--device cpu``, or ``cuda`` with a GPU): the estimate's seconds
without the probe, with it from a cold start (a worker process to start: torch imported,
on CUDA a context made), and again with every kernel cached (a plan's later rows, a search's
later steps), and what the peak changes by.

Run: ``python bench/kernel_probe_cost.py --device cpu --out PATH`` (needs torchvision).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch
import torchvision

import memlab_rs
from memlab_rs.estimation import _kernel_probe

MIB = 2**20


def _estimate(model, x, device: str, measure: bool):
    started = time.perf_counter()
    est = memlab_rs.estimate(
        model,
        x,
        optimizer=torch.optim.SGD,
        optimizer_kwargs={"lr": 0.1, "momentum": 0.9},
        device=device,
        measure_kernels=measure,
    )
    return est, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out")
    args = parser.parse_args()
    device = args.device
    side = 224 if device.startswith("cuda") else 96
    batches = (32, 64) if device.startswith("cuda") else (4, 8)
    threads = torch.get_num_threads()
    where = (
        torch.cuda.get_device_name(device)
        if device.startswith("cuda")
        else f"{platform.machine()}, {os.cpu_count()} CPUs, torch on {threads} threads"
    )
    lines = [
        f"kernel probe cost on {device} ({where}); torch {torch.__version__}, "
        f"torchvision {torchvision.__version__}",
        f"inputs {side} x {side}; seconds per estimate; peaks in MiB",
        "",
        f"{'model':<10} {'batch':>5} {'off s':>7} {'cold s':>7} {'cached s':>8} "
        f"{'cold/off':>8} {'cached/off':>10} {'peak off':>9} {'peak on':>9} {'change':>7}",
    ]
    for line in lines:
        print(line, flush=True)
    for name in ("resnet18", "resnet50"):
        model = getattr(torchvision.models, name)(weights=None)
        for batch in batches:
            x = torch.zeros(batch, 3, side, side)
            off, t_off = _estimate(model, x, device, False)
            _kernel_probe._cache.clear()  # cold: nothing measured, no worker
            on, t_cold = _estimate(model, x, device, True)
            _, t_cached = _estimate(model, x, device, True)
            change = on.peak_allocated / off.peak_allocated - 1
            line = (
                f"{name:<10} {batch:>5} {t_off:7.2f} {t_cold:7.2f} {t_cached:8.2f} "
                f"{t_cold / t_off:8.2f} {t_cached / t_off:10.2f} "
                f"{off.peak_allocated / MIB:9.1f} {on.peak_allocated / MIB:9.1f} "
                f"{change * 100:+6.1f}%"
            )
            lines.append(line)
            print(line, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
