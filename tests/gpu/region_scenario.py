"""A Courtesy region's whole story on one GPU, run in a process of its own by
test_courtesy_region_cuda.py (it fills the GPU, and pools stay for the life of a process):
GPT-2's training state (parameters, grads, AdamW state) in region "train", a CUDA graph of
a forward pass in region "graphs"; pause both; the driver's used memory drops by their size;
another region and another process use that memory meanwhile; resume; every tensor bitwise
equal at the same address, the graph replays to the same output, and training goes on with
the losses of a run never paused; then every region closes and nothing of ours remains.
Prints one JSON object of what it measured (the test asserts on it)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from memlab_rs import Courtesy, MemReporter, _core  # noqa: E402

MiB = 1 << 20
STEPS_BEFORE, STEPS_AFTER = 2, 3


def build(layers: int):
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=layers, n_embd=768, n_head=12, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    config._attn_implementation = "eager"  # its backward has no atomics: deterministic
    model = GPT2LMHeadModel(config).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    return model, optimizer


def batch(step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(step)
    return torch.randint(0, 50257, (4, 128), generator=g).cuda()


def train(model, optimizer, steps) -> list[float]:
    losses = []
    for step in steps:
        ids = batch(step)
        loss = model(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # the grads stay: part of the state
        losses.append(loss.item())
    return losses


def state_tensors(model, optimizer) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        out[name] = p
        out[name + ".grad"] = p.grad
        for key, value in optimizer.state[p].items():
            if torch.is_tensor(value) and value.is_cuda:
                out[f"{name}.{key}"] = value
    return out


def used() -> int:
    free, total = torch.cuda.mem_get_info()
    return total - free


def main() -> None:
    layers = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    torch.use_deterministic_algorithms(True)
    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}

    # The run never paused.
    model, optimizer = build(layers)
    out["reference_losses"] = train(model, optimizer, range(STEPS_BEFORE + STEPS_AFTER))
    del model, optimizer
    gc.collect()
    torch.cuda.empty_cache()

    train_region = Courtesy.region("train")
    graph_region = Courtesy.region("graphs")
    with train_region:
        model, optimizer = build(layers)
        losses = train(model, optimizer, range(STEPS_BEFORE))
        static_in = batch(99)
    model.eval()
    # The graph's forward takes SDPA: the eager path builds its causal mask from a CPU
    # tensor, which a capture refuses. (Training stays eager: its backward is deterministic.)
    model.config._attn_implementation = "sdpa"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph, pool=graph_region.pool_id):
        static_out = model(static_in).logits
    graph.replay()
    torch.cuda.synchronize()
    graph_before = static_out.cpu()
    model.train()
    model.config._attn_implementation = "eager"

    tensors = state_tensors(model, optimizer)
    addresses = {k: t.data_ptr() for k, t in tensors.items()}
    copies = {k: t.detach().cpu() for k, t in tensors.items()}
    out["state_bytes"] = sum(t.numel() * t.element_size() for t in tensors.values())
    region_bytes = train_region.state()["mapped_bytes"] + graph_region.state()["mapped_bytes"]
    out["region_bytes"] = region_bytes
    # Wait for the background thread to pin the host buffers (it runs as segments appear).
    for _ in range(600):
        if not any(t.name == "memlab-rs-pin" for t in threading.enumerate()):
            break
        threading.Event().wait(0.05)

    # Fill the GPU, so that what the pause gives back is all there is.
    free, _ = torch.cuda.mem_get_info()
    filler = torch.empty(max(0, free - 256 * MiB), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    free_full, _ = torch.cuda.mem_get_info()
    out["free_when_full"] = free_full

    before = used()
    report = Courtesy.pause()
    after = used()
    out["pause"] = {
        "text": str(report),
        "dropped": before - after,
        "region_bytes": report.region_bytes,
        "moved": report.moved_bytes,
        "seconds": report.seconds,
        "pin_seconds": report.pin_seconds,
        "gb_per_s": report.gb_per_s,
    }
    # The tensor report says why the driver shows less than torch reserves.
    reserved_line = [
        line
        for line in MemReporter().collect(device="cuda:0").text().splitlines()
        if line.startswith("Reserved by the caching allocator")
    ]
    out["report_while_paused"] = reserved_line
    # Another region takes the memory the pause gave back, then gives it back.
    other = Courtesy.region("other")
    want = region_bytes - 64 * MiB
    try:
        with other:
            borrowed = torch.empty(want, dtype=torch.uint8, device="cuda")
            borrowed.fill_(7)
        torch.cuda.synchronize()
        out["other_region_took"] = borrowed.numel()
        del borrowed
    except torch.OutOfMemoryError as error:
        out["other_region_took"] = 0
        out["other_region_error"] = str(error)[:300]
    other.close()
    # Another process too (its context needs some of it).
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch; x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); "
            "x.fill_(1); torch.cuda.synchronize(); print(int(x[0]))",
        ],
        capture_output=True,
        text=True,
    )
    out["other_process"] = {"rc": child.returncode, "out": child.stdout.strip(),
                            "err": child.stderr[-300:]}  # fmt: skip

    before = used()
    report = Courtesy.resume()
    after = used()
    out["resume"] = {
        "text": str(report),
        "grew": after - before,
        "region_bytes": report.region_bytes,
        "moved": report.moved_bytes,
        "seconds": report.seconds,
        "gb_per_s": report.gb_per_s,
    }
    del filler
    torch.cuda.empty_cache()

    tensors = state_tensors(model, optimizer)
    out["addresses_same"] = all(tensors[k].data_ptr() == a for k, a in addresses.items())
    out["bitwise_equal"] = all(torch.equal(tensors[k].cpu(), c) for k, c in copies.items())
    out["tensors_checked"] = len(copies)
    graph.replay()
    torch.cuda.synchronize()
    out["graph_same"] = bool(torch.equal(static_out.cpu(), graph_before))
    with train_region:
        losses += train(model, optimizer, range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER))
    out["losses"] = losses

    # Close everything: nothing of ours stays.
    del model, optimizer, tensors, static_in, static_out, graph, copies
    gc.collect()
    train_region.close()
    graph_region.close()
    gc.collect()
    torch.cuda.empty_cache()
    out["state_after_close"] = json.loads(_core.courtesy.region_state())
    # What torch itself still holds there: the cuBLAS workspace it made for the capture's
    # stream (in the capture's pool), kept for the life of the process unless cleared.
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    out["state_after_clearing_cublas"] = json.loads(_core.courtesy.region_state())
    out["counters"] = list(_core.courtesy.region_counters())
    out["pin_threads"] = [t.name for t in threading.enumerate() if t.name == "memlab-rs-pin"]
    probe = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
    out["new_allocation_ours"] = _core.courtesy.region_owner(probe.data_ptr())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
