"""The estimate against a real step on the GPU: the estimated peak allocated within 3% of
``torch.cuda.max_memory_allocated()`` of the first and of the second (steady) step, peak
stats reset before each, random weights (transformers GPT-2 124M 8x512 AdamW, torchvision
ResNet-50 batch 64 SGD with momentum). The workloads and the real step are the benchmark's
(bench/estimate_compare.py), so both measure the same thing."""

from __future__ import annotations

import pytest
import torch
from bench_modules import bench_module

pytestmark = pytest.mark.cuda

bench = bench_module("estimate_compare")


def _check(make):
    w = make("meta")
    if w is None:
        pytest.skip(f"{make.__name__}: transformers/torchvision missing")
    est = bench.ours(w)
    real = bench.real_steps(make(None))
    for n in (1, 2):
        error = est.step_peaks[n] / real[f"step {n}"] - 1
        print(
            f"{w['name']} step {n}: ours {est.step_peaks[n]} real {real[f'step {n}']} "
            f"({error * 100:+.2f}%)"
        )
        assert abs(error) < 0.03, (n, est.step_peaks, real)
    assert est.peak_allocated == max(est.step_peaks.values())


def test_gpt2_adamw_peak_within_3_percent():
    _check(bench.gpt2_workload)


def test_resnet50_sgd_peak_within_3_percent():
    _check(bench.resnet50_workload)


def test_estimate_needs_no_cuda_memory():
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    w = bench.resnet50_workload("meta")
    if w is None:
        pytest.skip("torchvision missing")
    bench.ours(w)
    assert torch.cuda.memory_allocated() == before
