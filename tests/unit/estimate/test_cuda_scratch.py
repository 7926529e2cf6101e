"""What CUDA kernels allocate inside one op, which fake tensors do not show, as the
estimate models it: the staging buffer of the reduction kernel (Reduce.cuh's
setReduceConfig) and the contiguous copy cuBLAS needs of an operand it cannot read
(Blas.cpp's prepare_matrix_for_cublas). The bytes are those measured on an H200 (132 SMs,
2048 threads each) around one op each (bench/zoo_hidden.py's probe), and whole steps'
peaks measured there; the GPU test (tests/gpu/test_estimate_scratch_cuda.py) compares many
random shapes with the device."""

from __future__ import annotations

import pytest
import torch

from memlab_rs import estimate
from memlab_rs.estimation._cuda_blas import operand_copies
from memlab_rs.estimation._cuda_reduce import reduction_scratch
from memlab_rs.models import TinyGPT

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


@pytest.mark.parametrize(
    "operand, copied",
    [
        (torch.empty(1, 1, device="meta").expand(1000, 20480), 1000 * 20480 * 4),  # out.sum()'s
        (torch.empty(20, 10, device="meta").t(), 0),  # a transpose: cuBLAS reads it as it is
        (torch.empty(10, 40, device="meta")[:, :20], 0),  # a unit stride and a long leading one
        (torch.empty(10, 40, device="meta")[:, ::2], 10 * 20 * 4),  # every other column
    ],
)
def test_cublas_gets_a_contiguous_copy_of_an_operand_it_cannot_read(operand, copied):
    other = torch.empty(operand.shape[1], 8, device="meta")
    assert sum(operand_copies("aten.mm.default", (operand, other))) == copied
    bias = torch.empty(8, device="meta")
    assert sum(operand_copies("aten.addmm.default", (bias, operand, other))) == copied


def test_the_estimate_of_a_tinygpt_step_is_the_h200s_to_the_mib():
    """bench/plan_check.py's TinyGPT (vocab 1000, dim 256, 4 layers, 4 heads, context 128)
    at batch 176 x 128 with AdamW, loss ``out.sum()``: on an H200 (torch 2.11) real steps
    peaked at 1905 and 1932 MiB allocated and 2186 MiB reserved. The reduction buffers
    raised the estimate from 1861/1888 MiB, the copy cuBLAS makes of the expanded
    gradient through the head the reserved peak from 2144 MiB."""
    model = TinyGPT(vocab=1000, dim=256, layers=4, heads=4, context=128)
    est = estimate(model, torch.zeros(176, 128, dtype=torch.long), optimizer=torch.optim.AdamW,
                   optimizer_kwargs={"lr": 1e-3}, device="cuda:0")  # fmt: skip
    assert (est.step_peaks[1] >> 20, est.step_peaks[2] >> 20) == (1905, 1932)
    assert est.peak_reserved >> 20 == 2186


def test_softmax_backward_takes_a_buffer_of_the_gradients_size_and_log_softmax_none():
    from memlab_rs.estimation._cuda_softmax import softmax_backward_scratch

    grad = torch.empty(160, 4, 128, 128, device="meta")
    name = "aten._softmax_backward_data.default"
    assert softmax_backward_scratch(name, (grad, grad, -1, torch.float32)) == [40 * MIB]
    half = grad.to(torch.bfloat16)
    assert softmax_backward_scratch(name, (half, half, -1, torch.bfloat16)) == [20 * MIB]
    assert softmax_backward_scratch("aten._log_softmax_backward_data.default", (grad,)) == []


def test_layer_norm_copies_a_strided_input_before_its_outputs():
    """CUDA's layer norm (forward and backward) clones an input that is not contiguous
    before it allocates its outputs; a dense one it reads as it is. The GPU test checks the
    kernel's first allocations against this for random layouts."""
    from memlab_rs.estimation._cuda_layer_norm import input_copies

    fwd, bwd = "aten.native_layer_norm.default", "aten.native_layer_norm_backward.default"
    permuted = torch.empty(16, 96, 56, 56, device="meta").permute(0, 2, 3, 1)
    w = torch.empty(96, device="meta")
    assert input_copies(fwd, (permuted, [96], w, w, 1e-5)) == [16 * 56 * 56 * 96 * 4]
    assert input_copies(fwd, (permuted.contiguous(), [96], w, w, 1e-5)) == []
    grad = torch.empty(16, 56, 56, 96, device="meta")
    mean = torch.empty(16, 56, 56, 1, device="meta")
    args = (grad, permuted, [96], mean, mean, w, None, [True, True, False])
    assert input_copies(bwd, args) == [16 * 56 * 56 * 96 * 4]
    assert input_copies("aten.add.Tensor", (permuted, permuted)) == []


def test_a_cuda_estimate_counts_layer_norms_copy_of_a_permuted_input(monkeypatch):
    """Swin's stem (a patch convolution, channels moved last, LayerNorm): the copy is in the
    step's allocations, once in forward and once in backward, and only on CUDA."""

    class Stem(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 32, 4, stride=4)
            self.norm = torch.nn.LayerNorm(32)

        def forward(self, x):
            return self.norm(self.conv(x).permute(0, 2, 3, 1))

    from memlab_rs.estimation import estimator

    books = []
    real_replay = estimator.replay

    def keep(book):
        books.append(book)
        return real_replay(book)

    monkeypatch.setattr(estimator, "replay", keep)
    for device in ("cuda:0", "cpu"):
        estimate(Stem(), torch.zeros(4, 3, 64, 64), device=device, measure_kernels=False)
    copies = [[o for o in book.origins if "contiguous copy of an input" in o] for book in books]
    assert [len(c) for c in copies] == [2, 0], copies
    assert any("native_layer_norm_backward" in o for o in copies[0])
