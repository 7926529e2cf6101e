"""MemReporter on CUDA: exact bytes, and the whole of memory_allocated accounted for."""

from __future__ import annotations

import pytest
import torch

from memlab_rs import MemReporter
from memlab_rs.models import TinyGPT

pytestmark = pytest.mark.cuda


def test_linear_weight_on_cuda_is_four_megabytes():
    linear = torch.nn.Linear(1024, 1024).cuda()
    rows = {r.name: r for r in MemReporter(linear).collect(device="cuda:0").rows}
    assert rows["weight"].bytes == 4 * 1024 * 1024
    assert rows["bias"].bytes == 4096


def test_small_cuda_storages_round_up_to_512_bytes():
    one = torch.ones(1, device="cuda")
    odd = torch.ones(129, device="cuda")  # 516 bytes -> 1024
    rows = MemReporter().collect(device="cuda").rows
    sizes = {r.storage_bytes: r.bytes for r in rows if r.storage_bytes in (4, 516)}
    assert sizes == {4: 512, 516: 1024}
    del one, odd


def _check_accounting(report, device="cuda:0"):
    section = next(s for s in report.sections() if s["device"] == device)
    allocated = torch.cuda.memory_allocated(device)
    assert section["allocated"] == allocated
    assert section["total_bytes"] + section["unseen_tensors"] + section["rounding"] == allocated
    return section


def test_gpt2_sized_step_is_fully_accounted_for(capsys):
    torch.manual_seed(0)
    model = TinyGPT(vocab=50257, dim=768, layers=12, heads=12, context=1024).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    reporter = MemReporter(model)
    reporter.add_optimizer(optimizer)
    tokens = torch.randint(0, 50257, (8, 513), device="cuda")

    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50257), tokens[:, 1:].reshape(-1))
    # Mid-step: autograd holds activations that Python cannot see.
    mid = _check_accounting(reporter.collect(device="cuda:0"))
    assert mid["unseen_tensors"] > 100 * 2**20

    loss.backward()
    optimizer.step()
    del logits, loss
    after = reporter.collect(device="cuda:0")
    section = _check_accounting(after)
    rows = {r.name: r for r in after.rows}
    assert rows["wte.weight+lm_head.weight"].bytes == 50257 * 768 * 4
    assert rows["wte.weight+lm_head.weight.grad"].bytes == 50257 * 768 * 4
    assert rows["AdamW.wte.weight+lm_head.weight.exp_avg"].bytes == 50257 * 768 * 4
    # params + grads + two AdamW moments, each counted once
    n_params = sum(p.numel() for p in model.parameters())
    named_bytes = sum(r.bytes for r in after.rows if not r.name.startswith("Tensor"))
    assert named_bytes >= 4 * n_params * 4
    assert section["unseen_tensors"] >= 0

    reporter.report(device="cuda:0")
    out = capsys.readouterr().out
    assert "The allocated memory on cuda:0: " in out
    assert "= torch.cuda.memory_allocated(cuda:0)" in out


def test_report_does_not_initialise_cuda_by_itself(script):
    out = script(
        "import torch, memlab_rs\n"
        "memlab_rs.MemReporter().report()\n"
        "print(torch.cuda.is_initialized())\n"
    )
    assert out.strip().endswith("False")


def test_driver_view_of_the_device():
    from memlab_rs import _core

    torch.ones(1, device="cuda")
    used, total = _core.driver_device_memory(torch.cuda.current_device())
    free, total_torch = torch.cuda.mem_get_info()
    assert total == total_torch
    assert used >= torch.cuda.memory_reserved()
