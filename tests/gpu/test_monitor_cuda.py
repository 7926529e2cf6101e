"""The training monitor on CUDA (run on the GPU machine): transformers GPT-2 and torchvision
ResNet-50 with random weights. Categories sum exactly to the peak allocated; parameter,
buffer, gradient and optimizer-state bytes equal the tensors'; cached matches torch."""

from __future__ import annotations

import io

import pytest
import torch

import memlab_rs
from memlab_rs._categories import CATEGORIES

pytestmark = pytest.mark.cuda


def storage_bytes(tensors) -> int:
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def check(monitor, model, optimizer, steps):
    rows = monitor.rows()
    assert len(rows) == steps
    params = storage_bytes(model.parameters())
    buffers = storage_bytes(model.buffers())
    state = storage_bytes(v for st in optimizer.state.values() for v in st.values())
    for r in rows:
        values = [r[c] for c in CATEGORIES]
        assert all(v >= 0 for v in values), r
        assert sum(values) == r["peak_allocated"], r
        assert r["parameter"] == params == r["weight_usage"]
        assert r["buffer"] == buffers
        assert r["weight_gradient_usage"] == params  # every parameter gets a gradient
        assert r["optimizer_state_usage"] == state
        assert r["backward_passes"] == 1
        assert 0 < r["feature_maps"] < r["peak_allocated"] <= r["peak_cached"]
        assert r["notice"] is None
    # The monitor read the allocator just now and reset its peaks.
    assert rows[-1]["current_cached"] == torch.cuda.memory_reserved()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()


def test_gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=5000)
    model = transformers.GPT2LMHeadModel(config).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 5000, (4, 128), device="cuda")
    with memlab_rs.memory_profiler(model, optimizer=opt, file=io.StringIO()) as monitor:
        assert monitor.device == "cuda:0"
        for _ in range(3):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            monitor.record_stats()
        check(monitor, model, opt, 3)
    # GPT-2 ties lm_head.weight to wte.weight: one row under both names.
    assert "\n  transformer.wte.weight+lm_head.weight..." in monitor.text()


def test_resnet50():
    models = pytest.importorskip("torchvision.models")
    torch.manual_seed(0)
    model = models.resnet50().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(16, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (16,), device="cuda")
    with memlab_rs.memory_profiler(model, optimizer=opt, verbose=True, file=io.StringIO()) as mon:
        for _ in range(3):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            mon.record_stats()
        check(mon, model, opt, 3)
    modules = dict(mon.result().to_data()["details"][-1]["modules"])
    assert sum(modules.values()) == mon.rows()[-1]["feature_maps"]
    assert "conv1" in modules


def test_cpu_tensors_are_not_counted_on_cuda():
    model = torch.nn.Linear(256, 256).cuda()
    opt = torch.optim.Adam(model.parameters())  # its "step" tensors live on the CPU
    with memlab_rs.memory_profiler(model, optimizer=opt, file=io.StringIO()) as monitor:
        model(torch.randn(8, 256, device="cuda")).sum().backward()
        opt.step()
        monitor.record_stats()
    (r,) = monitor.rows()
    assert r["optimizer_state_usage"] == 2 * (256 * 256 + 256) * 4


def gpt2_rows(mode: str, steps: int):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=5000)
    model = transformers.GPT2LMHeadModel(config).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 5000, (4, 128), device="cuda")
    with memlab_rs.memory_profiler(
        model, optimizer=opt, file=io.StringIO(), feature_maps=mode
    ) as monitor:
        for _ in range(steps):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            monitor.record_stats()
    return monitor.rows()


def test_auto_reuses_measured_figures_on_gpt2():
    every = gpt2_rows("every", 6)
    auto = gpt2_rows("auto", 6)
    # The allocator's signature of a GPT-2 step is stable: from step 4 on, no hooks.
    assert [r["feature_maps_from"] for r in auto] == [1, 2, 3, 3, 3, 3]
    keys = ["feature_maps", "peak_allocated", "peak_window", *CATEGORIES]
    for a, e in zip(auto, every):
        assert {k: a[k] for k in keys} == {k: e[k] for k in keys}
        assert sum(a[c] for c in CATEGORIES) == a["peak_allocated"]


def test_intermediate_gradients_on_cuda_are_the_cpu_runs():
    # The same NeuMF step on both devices: the gradients the backward passes between its
    # nodes have the same storages' bytes, and autograd's device thread runs the hooks.
    from neumf import NeuMF

    figures = {}
    for device in ("cpu", "cuda:0"):
        torch.manual_seed(0)
        model = NeuMF().to(device)
        optimizer = torch.optim.Adam(model.parameters())
        user = torch.randint(0, 1000, (4096,), device=device)
        item = torch.randint(0, 2000, (4096,), device=device)
        label = torch.rand(4096, device=device)
        with memlab_rs.memory_profiler(model, optimizer=optimizer, file=io.StringIO()) as mon:
            for _ in range(4):
                out = model(user, item)
                torch.nn.functional.binary_cross_entropy_with_logits(out, label).backward()
                optimizer.step()
                optimizer.zero_grad()
                mon.record_stats()
        figures[device] = [r["intermediate_gradients"] for r in mon.rows()]
    assert figures["cpu"][0] > 1_500_000
    assert figures["cuda:0"] == figures["cpu"] == [figures["cpu"][0]] * 4
