"""cuDNN's convolution workspaces, measured by the estimate's kernel probe on this GPU: the
zoo's rows that missed by 3-8% without them (plain convolution stacks, checkpointed ResNets,
SqueezeNet, MobileNet in bf16) against real steps (``bench/estimate_zoo.py``'s own
measurement), and the probe leaves nothing behind in this process or on the GPU."""

from __future__ import annotations

import pytest
import torch
from bench_modules import bench_module

import memlab_rs
from memlab_rs.estimation import _kernel_probe

pytestmark = pytest.mark.cuda

zoo_bench = bench_module("estimate_zoo")
zoo = zoo_bench.zoo

MISSED_BEFORE = [
    "plain_vgg fp32 sgd-foreach",
    "plain_vgg amp-bf16 sgd-foreach",
    "squeezenet1_1 fp32 sgd-foreach",
    "mobilenet_v2 bf16 sgd-foreach",
    "resnet18 fp32 sgd-foreach ckpt",
    "resnet50 amp-bf16 sgd-foreach ckpt",
]


@pytest.mark.parametrize("name", MISSED_BEFORE)
def test_rows_that_missed_by_the_workspaces_are_within_3_percent(name):
    rows = [r for r in zoo.rows("cuda") if r.name == name]
    if not rows:
        pytest.skip(f"{name}: torchvision missing")
    row = rows[0]
    outcome = zoo_bench.run_row(row, row.workload.build(), "cuda:0",
                                zoo_bench.CudaMeter("cuda:0"), real=True)  # fmt: skip
    assert outcome.est is not None, outcome.est_error
    assert outcome.real is not None, outcome.real_error
    first, steady = outcome.errors()
    print(f"{name}: first {first * 100:+.2f}%, steady {steady * 100:+.2f}%")
    assert abs(first) < 0.03 and abs(steady) < 0.03, zoo_bench.line(outcome)
    assert any("cuDNN workspaces measured on" in n for n in outcome.est.notes)


def _convnet() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10),
    )  # fmt: skip


def test_the_probe_leaves_no_memory_in_this_process_nor_a_context_on_the_gpu():
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    free_before, _ = torch.cuda.mem_get_info()
    est = memlab_rs.estimate(_convnet(), torch.zeros(16, 3, 64, 64), optimizer=torch.optim.SGD,
                             optimizer_kwargs={"lr": 0.1})  # fmt: skip
    assert any("cuDNN workspaces measured on" in n for n in est.notes), est.notes
    assert torch.cuda.memory_allocated() == before
    assert not _kernel_probe._workers  # the worker exited with its estimate ...
    free_after, _ = torch.cuda.mem_get_info()
    assert abs(free_after - free_before) < 64 << 20  # ... and its context with it


def test_without_measuring_the_workspaces_are_missing():
    model, x = _convnet(), torch.zeros(32, 3, 96, 96)
    measured = memlab_rs.estimate(model, x, optimizer=torch.optim.SGD, optimizer_kwargs={"lr": 0.1})
    blind = memlab_rs.estimate(model, x, optimizer=torch.optim.SGD, optimizer_kwargs={"lr": 0.1},
                               measure_kernels=False)  # fmt: skip
    assert blind.peak_allocated <= measured.peak_allocated
    assert "convolutions' cuDNN workspaces not counted (measure_kernels=False)" in blind.notes
