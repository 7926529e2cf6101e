"""memlab_rs.estimate in mixed precision: CUDA's autocast put back on meta tensors (torch's
own policy, the weights' cast cache, regions model code opens or turns off, activation
checkpointing's recomputation), CPU's autocast as torch runs it, the GradScaler against a
real CPU step, CUDA kernels chosen above autograd (fused rms_norm), the result's fields,
clear errors. The oracle against torch's C++ autocast on fake CUDA tensors is
tests/integration/test_estimate_processes.py (it needs an interpreter of its own)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from autocast_oracle import forward_allocations
from causal_attention import CausalAttention
from cpu_step_rises import cpu_step_rises
from torch import nn

import memlab_rs
from memlab_rs import estimate, max_batch_size
from memlab_rs._sources import cpu_source as _cpu_source
from memlab_rs.estimation._cuda_dispatch import autocast_ops

needs_cpu_hook = pytest.mark.skipif(
    _cpu_source.library() is None, reason="this torch has no libc10.so (the fallback is used)"
)
BF16, FP16 = torch.bfloat16, torch.float16


def storages(allocations):
    return [a[1:] for a in allocations]


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 32)

    def forward(self, x):
        return self.lin(x) + self.lin(x)


def test_a_weight_is_cast_once_per_region_and_an_input_each_time():
    got = forward_allocations(Twice(), torch.zeros(4, 64), "meta", BF16)
    assert storages(got) == [
        ["torch.bfloat16", 32 * 2],  # the bias's cast (C++ casts the last argument first)
        ["torch.bfloat16", 32 * 64 * 2],  # the weight's
        ["torch.bfloat16", 4 * 64 * 2],  # the input's
        ["torch.bfloat16", 4 * 32 * 2],  # addmm
        ["torch.bfloat16", 4 * 64 * 2],  # the input again: not a leaf that requires grad
        ["torch.bfloat16", 4 * 32 * 2],  # addmm: the weight and bias casts from the cache
        ["torch.bfloat16", 4 * 32 * 2],  # add
        ["torch.float32", 4 * 32 * 4],  # the oracle's loss: out.float().sum()
        ["torch.float32", 4],
    ]
    assert all(op == "aten._to_copy.default" for op, *_ in got[:3])


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.ln = nn.Linear(16, 16), nn.LayerNorm(16)

    def forward(self, x):
        h = self.lin(x)  # in the region's dtype
        return torch.cat([self.ln(h), h.softmax(-1)], -1)


@pytest.mark.parametrize("amp", [BF16, FP16])
def test_torch_s_own_policy_float32_ops_and_softmax(amp):
    got = storages(forward_allocations(Policy(), torch.zeros(2, 16), "meta", amp))
    low = str(amp)
    assert got[:4] == [[low, 32], [low, 512], [low, 64], [low, 64]]  # casts, addmm
    # layer_norm is on the float32 list: a float32 cast of h, then its three outputs.
    assert got[4:8] == [["torch.float32", 128], ["torch.float32", 128]] + [["torch.float32", 8]] * 2
    # softmax sets dtype=float32: a bfloat16 input is copied to float32 first; CUDA's
    # softmax of a half input writes float32 directly (half_to_float), without the copy.
    softmax = [["torch.float32", 128]] * (2 if amp == BF16 else 1)
    assert got[8:] == [*softmax, ["torch.float32", 256], ["torch.float32", 4]]


def test_the_ops_autocast_come_from_the_dispatcher():
    ops = set(autocast_ops())
    assert {"aten::linear", "aten::layer_norm", "aten::softmax.int", "aten::bmm"} <= ops
    assert "aten::add.Tensor" not in ops and "aten::relu" not in ops


def test_cuda_autocast_in_an_estimate_counts_the_casts_and_frees_them_at_the_region_s_end():
    model, x = nn.Linear(1024, 1024), torch.zeros(8, 1024)
    plain = estimate(model, x, device="cuda")
    mixed = estimate(model, x, device="cuda", autocast=BF16)
    # Autograd saves the input's bfloat16 cast (for the weight's gradient); the weight's
    # cast is not saved (the input needs no gradient) and goes when the region exits.
    assert plain.activations == 0 and mixed.activations == 8 * 1024 * 2
    casts = 1024 * 2 + 1024 * 1024 * 2  # the bias's and the weight's
    assert mixed.phase_peaks["forward 1"] - mixed.phase_ends["forward 1"] == casts
    # float32 output (32 KiB) against its bfloat16 cast input and output (16 KiB each).
    assert mixed.phase_ends["forward 1"] == plain.phase_ends["forward 1"]
    assert mixed.gradients == plain.gradients == 1024 * 1024 * 4 + 1024 * 4


def test_cuda_autocast_attention_runs_the_flash_kernel_on_the_cast_inputs():
    est = estimate(CausalAttention(), torch.zeros(2, 128, 64), device="cuda", autocast=BF16)
    # Saved: the input's cast (for the weight's gradient), the bfloat16 qkv output and
    # flash attention's output, float logsumexp and its rng state (two uint64 tensors on
    # the GPU, flash_api.cpp: a 512 B block each); no float32 copies.
    x_cast, qkv, out, lse = 2 * 128 * 64 * 2, 2 * 128 * 192 * 2, 2 * 128 * 64 * 2, 2 * 128 * 4
    assert est.activations == x_cast + qkv + out + lse + 2 * 512


class Rotary(nn.Module):
    """As transformers' rotary embeddings: a float32 region model code turns autocast off
    in, for the tensors' own device type."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, x):
        with torch.autocast(x.device.type, enabled=False):
            angles = x.float() @ x.float().transpose(-1, -2)
        return self.lin(x) + angles.sum(-1, keepdim=True)


def test_a_region_model_code_turns_off_runs_in_float32_for_meta_tensors_too():
    got = storages(forward_allocations(Rotary(), torch.zeros(2, 8, 32), "meta", BF16))
    assert got[:3] == [
        ["torch.float32", 2 * 8 * 8 * 4],  # the matmul (bmm) in float32: not cast
        ["torch.bfloat16", 32 * 2],  # then the linear layer's casts, autocast on again
        ["torch.bfloat16", 32 * 32 * 2],
    ]
    est = estimate(Rotary(), torch.zeros(2, 8, 32), device="cuda", autocast=BF16)
    assert est.peak_allocated > 0


def test_a_region_model_code_opens_casts_as_on_a_gpu():
    class Opens(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(64, 64)

        def forward(self, x):
            with torch.autocast("cuda", dtype=torch.bfloat16):  # no GPU here: still on
                return self.lin(x)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not "CUDA is not available. Disabling autocast"
        est = estimate(Opens(), torch.zeros(8, 64), device="cuda")
    assert est.activations == 8 * 64 * 2  # the input's bfloat16 cast
    assert est.autocast is None  # not asked for: the model's own region
    assert not torch.is_autocast_enabled("cuda")
    assert torch.amp.autocast_mode.autocast.__init__.__module__ == "torch.amp.autocast_mode"


def test_checkpointing_recomputes_under_autocast():
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False)

    x = torch.zeros(16, 64, requires_grad=True)
    # The recomputation must make the forward's dtypes, or checkpoint raises CheckpointError
    # ("Recomputed values ... have different metadata"): it asks
    # torch.amp.is_autocast_available("meta"), answered as for CUDA while the step runs.
    est = estimate(Checkpointed(), x, device="cuda", autocast=BF16)
    # Nothing of the checkpointed block is saved: only what checkpoint keeps (its input).
    assert est.activations == 0 and est.peak_by_category["activation"] == 0


def test_cpu_autocast_is_torch_s_own():
    model, x = nn.Linear(256, 256), torch.zeros(8, 256, requires_grad=True)
    est = estimate(model, x, device="cpu", autocast=BF16)
    # The input's and the weight's bfloat16 casts, both saved (the input needs a gradient).
    assert est.activations == 8 * 256 * 2 + 256 * 256 * 2


def test_cuda_runs_rms_norm_s_fused_kernel():
    model, x = nn.Sequential(nn.Linear(64, 64), nn.RMSNorm(64)), torch.zeros(8, 64)
    # CUDA's _fused_rms_norm saves its input and a float rstd per row (rounded to 512 B);
    # the composite meta would run saves more.
    assert estimate(model, x, device="cuda").activations == 8 * 64 * 4 + 512


def _real_cpu_step_rises(model, x, opt, scaler):
    def step():
        loss = model(x).sum()
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=True)

    return cpu_step_rises(step, 2)


@needs_cpu_hook
def test_what_the_grad_scaler_adds_is_what_a_real_cpu_step_s_adds():
    kwargs = {"lr": 0.1, "momentum": 0.9}
    estimated, real = {}, {}
    for scaled in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 8))
        x = torch.zeros(16, 64)
        est = estimate(
            model, x, optimizer=torch.optim.SGD, optimizer_kwargs=kwargs, device="cpu",
            grad_scaler=scaled,
        )  # fmt: skip
        starts = {1: est.phase_ends["setup"], 2: est.phase_ends["optimizer 1"]}
        estimated[scaled] = {n: p - starts[n] for n, p in est.step_peaks.items()}
        opt = torch.optim.SGD(model.parameters(), **kwargs)
        scaler = torch.amp.GradScaler("cpu") if scaled else None
        real[scaled] = _real_cpu_step_rises(model, x, opt, scaler)
    # (The step without a scaler is 512 B over on this model on CPU, scaler or not.)
    for n in (1, 2):
        added = estimated[True][n] - estimated[False][n]
        assert added == real[True][n] - real[False][n] > 0


def test_the_grad_scaler_keeps_its_scale_and_growth_tracker_on_cuda():
    model, x = nn.Linear(256, 256), torch.zeros(8, 256)
    opt = {"optimizer": torch.optim.SGD, "optimizer_kwargs": {"lr": 0.1}, "device": "cuda"}
    plain = estimate(model, x, **opt, autocast=FP16)
    scaled = estimate(model, x, **opt, autocast=FP16, grad_scaler=True)
    # After each step: the scale (float32) and growth tracker (int32), 512 B blocks each.
    for phase in ("backward 1", "optimizer 1", "optimizer 2"):
        assert scaled.phase_ends[phase] - plain.phase_ends[phase] == 1024
    assert scaled.grad_scaler and scaled.autocast == "float16"
    assert any("gradients assumed finite" in n for n in scaled.notes)


def test_the_result_says_what_was_modelled_and_round_trips(tmp_path):
    est = estimate(nn.Linear(8, 8), torch.zeros(2, 8), device="cpu", autocast=BF16,
                   grad_scaler=True)  # fmt: skip
    data = json.loads(est.to_json())
    assert (data["autocast"], data["grad_scaler"], data["dtype"]) == ("bfloat16", True, None)
    assert "Note: precision: torch.autocast(bfloat16), a GradScaler\n" in est.text()
    assert "Precision: torch.autocast(bfloat16), a GradScaler" in est.html()
    path = tmp_path / "amp.json"
    est.save(path)
    assert memlab_rs.load(path) == est
    # A file saved before mixed precision was modelled has neither field.
    saved = json.loads(path.read_text())
    del saved["data"]["autocast"], saved["data"]["grad_scaler"]
    path.write_text(json.dumps(saved))
    old = memlab_rs.load(path)
    assert (old.autocast, old.grad_scaler) == (None, False)
    assert "precision" not in old.text()


def test_max_batch_size_passes_autocast_through():
    model = nn.Linear(1000, 1000)

    def need(batch, **amp):
        est = estimate(model, torch.zeros(batch, 1000), device="cpu", **amp)
        return est.peak_allocated

    budget = 12_000_000
    amp = {"autocast": BF16, "grad_scaler": True}
    best = max_batch_size(
        model, lambda b: torch.zeros(b, 1000), budget=budget, device="cpu", measure="allocated",
        **amp,
    )  # fmt: skip
    assert need(best, **amp) <= budget < need(best + 1, **amp)
    assert best != max_batch_size(
        model, lambda b: torch.zeros(b, 1000), budget=budget, device="cpu", measure="allocated"
    )


def test_bad_mixed_precision_arguments_are_clear_errors():
    model, x = nn.Linear(4, 4), torch.zeros(2, 4)
    with pytest.raises(ValueError, match="autocast must be torch.bfloat16, torch.float16"):
        estimate(model, x, device="cpu", autocast=torch.float32)
    with pytest.raises(TypeError, match="autocast must be"):
        estimate(model, x, device="cpu", autocast="bf16")
    with pytest.raises(TypeError, match="grad_scaler must be True or False"):
        estimate(model, x, device="cpu", grad_scaler="yes")
    with pytest.raises(ValueError, match="grad_scaler=True .* needs backward=True"):
        estimate(model, x, device="cpu", grad_scaler=True, backward=False)
    with pytest.raises(ValueError, match="autocast must be"):
        max_batch_size(model, lambda b: torch.zeros(b, 4), budget=10**6, autocast=torch.int8)
    # float16 parameters cannot be unscaled: torch's own GradScaler says so.
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        estimate(model, x, optimizer=torch.optim.SGD, optimizer_kwargs={"lr": 0.1},
                 device="cuda", dtype=FP16, grad_scaler=True)  # fmt: skip
