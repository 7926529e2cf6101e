"""Courtesy speed on a GPT-2 (124M) training state with AdamW state and grads: yield and
restore bandwidth against a pinned copy of the same number of bytes measured in the same
run, and pytorch_memlab 0.3.2's Courtesy side by side (where it does not crash).

    python bench/courtesy_bandwidth.py [--rounds 6]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from memlab_rs import Courtesy


def gpt2_state(dev):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12)).to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 50257, (4, 256), device=dev)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()  # grads are kept: a preemption can come before zero_grad
    return model, optimizer


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def pinned_copy_seconds(nbytes, dev):
    """Median seconds of one pinned copy of `nbytes` to the host and to the device."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    d2h = statistics.median(timed(lambda: host.copy_(device, non_blocking=True)) for _ in range(5))
    h2d = statistics.median(timed(lambda: device.copy_(host, non_blocking=True)) for _ in range(5))
    return d2h, h2d


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    if not torch.cuda.is_available():
        print("courtesy_bandwidth: needs a CUDA GPU (Courtesy moves GPU memory); skipped")
        return
    dev = torch.device("cuda:0")
    model, optimizer = gpt2_state(dev)
    state = torch.cuda.memory_allocated(dev)
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"GPT-2 state on the GPU: {state / 1e9:.2f} GB allocated")

    d2h, h2d = pinned_copy_seconds(state, dev)
    torch.cuda.empty_cache()
    print(f"pinned copy of {state / 1e9:.2f} GB: to host {state / d2h / 1e9:.1f} GB/s, "
          f"to device {state / h2d / 1e9:.1f} GB/s")

    courtesy = Courtesy()
    yields, restores = [], []
    for i in range(args.rounds):
        y_seconds = timed(lambda: yields.append(courtesy.yield_memory()))
        report = yields[-1]
        if i <= 1:
            marks = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in courtesy.phases.items())
            print(f"yield {i + 1} phases (ms since start): {marks}")
        if i == 0:
            print(report)
            left = torch.cuda.memory_allocated(dev)
            print(f"after yield: memory_allocated {left} B, report says unmoved "
                  f"{report.still_allocated['cuda:0']} B")
        r_seconds = timed(lambda: restores.append(courtesy.restore()))
        yields[-1] = (report.moved_bytes, y_seconds)
        restores[-1] = (restores[-1].restored_bytes, r_seconds)
    later_y = [b / s / 1e9 for b, s in yields[1:]]
    later_r = [b / s / 1e9 for b, s in restores[1:]]
    y, r = statistics.median(later_y), statistics.median(later_r)
    print(f"memlab_rs yield   (2nd on, median): {y:5.1f} GB/s = {y / (state / d2h / 1e9):.0%} "
          f"of pinned; first {yields[0][0] / yields[0][1] / 1e9:.1f} GB/s")
    print(f"memlab_rs restore (2nd on, median): {r:5.1f} GB/s = {r / (state / h2d / 1e9):.0%} "
          f"of pinned; first {restores[0][0] / restores[0][1] / 1e9:.1f} GB/s")

    try:
        from pytorch_memlab import Courtesy as PeerCourtesy
    except ImportError:
        print("pytorch_memlab: not installed")
        return
    peer = PeerCourtesy()
    try:
        y_seconds = timed(peer.yield_memory)
        r_seconds = timed(peer.restore)
        print(f"pytorch_memlab yield {state / y_seconds / 1e9:5.1f} GB/s, "
              f"restore {state / r_seconds / 1e9:5.1f} GB/s (state bytes / wall time)")
    except Exception as error:  # noqa: BLE001 - report the peer's failure, do not hide it
        print(f"pytorch_memlab Courtesy failed: {type(error).__name__}: {error}")


if __name__ == "__main__":
    main()
