"""The staging buffer of CUDA's reduction kernel, reproduced from Reduce.cuh's
setReduceConfig: the bytes measured on an H200 (132 SMs, 2048 threads each) around one
``sum`` each (bench/zoo_hidden.py's probe), and what the estimate adds for them. The GPU
test (tests/gpu/test_estimate_reduce_cuda.py) compares many random shapes with the device."""

from __future__ import annotations

import pytest
import torch

from memlab_rs import estimate
from memlab_rs.estimation._cuda_reduce import reduction_scratch

H200 = (132, 2048)
MIB = 1 << 20


@pytest.mark.parametrize(
    "shape, dtype, dims, measured_mib",
    [
        ((5376, 2048), torch.float32, [0], 84),  # an MLP's bias gradient, fp32
        ((13824, 2048), torch.bfloat16, [0], 132),  # the same in bf16 (a float accumulator)
        ((176, 128, 1024), torch.float32, [0, 1], 132),  # TinyGPT's fc bias gradient
    ],
)
def test_the_staging_buffer_is_the_one_measured_on_the_gpu(shape, dtype, dims, measured_mib):
    t = torch.empty(shape, dtype=dtype, device="meta")
    buffer, semaphores = reduction_scratch(t, dims, *H200)
    assert buffer == measured_mib * MIB
    assert 0 < semaphores <= 4096


@pytest.mark.parametrize(
    "shape, dims",
    [((5376, 2048), [1]), ((5376, 2048), None), ((64, 64), [0]), ((7,), [0]), ((), None)],
)
def test_short_or_innermost_reductions_take_little_or_nothing(shape, dims):
    t = torch.empty(shape, device="meta")
    assert sum(reduction_scratch(t, dims, *H200)) < 64 * 1024


def test_the_estimate_of_an_mlp_step_is_the_h200s_to_the_mib():
    """bench/plan_check.py's MLP (6 blocks of Linear(2048, 2048) and GELU, a head of 16)
    at batch 5376 with AdamW: max_memory_allocated of real steps on an H200 (torch 2.11)
    was 807 MiB (step 1) and 999 MiB (step 2), 58 MiB above the estimate before the bias
    gradients' staging buffers were modelled; its max_memory_reserved was 1088 MiB."""
    blocks = [torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.GELU()) for _ in range(6)]
    model = torch.nn.Sequential(*blocks, torch.nn.Linear(2048, 16))
    est = estimate(model, torch.zeros(5376, 2048), optimizer=torch.optim.AdamW,
                   optimizer_kwargs={"lr": 1e-3}, device="cuda:0")  # fmt: skip
    assert (est.step_peaks[1] >> 20, est.step_peaks[2] >> 20) == (807, 999)
    assert est.peak_reserved >> 20 == 1088
    assert "staging buffers" in " ".join(est.notes)
