"""estimate(world_size=N, parallel="ddp" | "fsdp2"): one rank's memory equals what torch's
own DDP and FSDP2 allocate, to the byte, on models with tied weights, batch-norm buffers,
several DDP buckets and dimensions no world size divides (``tests/helpers/parallel_oracle``
runs them on a fake process group and records them with the estimate's recorder); random
MLPs too; bad arguments name the parameter; the result saves, loads and says whose memory
it is; ``plan`` and ``max_batch_size`` take the same arguments."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from parallel_models import OPTIMIZERS, loss_fn, model_named

import memlab_rs
from memlab_rs import estimate, max_batch_size, plan

ORACLE = os.path.join(os.path.dirname(__file__), "..", "..", "helpers", "parallel_oracle.py")


def oracle(
    mode: str, name: str, world_size: int, optimizer: str, ckpt: bool = False, bf16: bool = False
) -> dict:
    """Step peaks of torch's own DDP or FSDP2 on `name` (in an interpreter of its own: the
    fake process group is process-wide)."""
    args = [sys.executable, ORACLE, mode, name, str(world_size), optimizer]
    args += (["ckpt"] if ckpt else []) + (["bf16"] if bf16 else [])
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    peaks = json.loads(done.stdout.strip().splitlines()[-1])["step_peaks"]
    return {int(k): v for k, v in peaks.items()}


def estimated(
    mode: str, name: str, world_size: int, optimizer: str, ckpt: bool = False, bf16: bool = False
):
    model, inputs = model_named(name)
    return estimate(
        model, inputs, optimizer=OPTIMIZERS[optimizer], loss_fn=loss_fn, device="cpu",
        world_size=world_size, parallel=mode, checkpointing=ckpt,
        dtype=torch.bfloat16 if bf16 else None,
        measure_kernels=False,  # the oracle records ops' outputs: no kernel's own scratch
    )  # fmt: skip


CASES = [
    ("ddp", "mlp", 2, "adamw", False),
    ("ddp", "wide", 3, "sgd", False),  # 50 MB: several buckets, rebuilt at step 2
    ("ddp", "cnn", 2, "sgd", False),  # batch-norm buffers broadcast before each forward
    ("ddp", "tinygpt", 4, "adamw", True),
    ("fsdp2", "mlp", 3, "sgd", False),
    ("fsdp2", "ragged", 4, "adamw", False),  # no dimension divides: padded shards
    ("fsdp2", "tinygpt", 2, "adamw", False),  # tied embedding and head in the root
    ("fsdp2", "tinygpt", 3, "sgd", True),  # checkpointed blocks recompute in backward
    ("fsdp2", "cnn", 2, "adamw", False),
    ("fsdp2", "wide", 2, "adamw", False),
    ("fsdp2", "blocks_only", 2, "adamw", False),  # a root without parameters: no group
]


@pytest.mark.parametrize("mode,name,world_size,optimizer,ckpt", CASES)
def test_one_rank_is_what_torchs_own_wrapper_allocates(mode, name, world_size, optimizer, ckpt):
    est = estimated(mode, name, world_size, optimizer, ckpt)
    assert est.step_peaks == oracle(mode, name, world_size, optimizer, ckpt)
    assert (est.world_size, est.parallel) == (world_size, mode)
    assert est.collective_buffers > 0


@pytest.mark.parametrize("mode,name", [("fsdp2", "tinygpt"), ("ddp", "cnn")])
def test_in_bfloat16_too(mode, name):
    """``dtype=torch.bfloat16``: the model and its float inputs cast, as ``model.to``."""
    assert estimated(mode, name, 2, "adamw", bf16=True).step_peaks == oracle(
        mode, name, 2, "adamw", bf16=True
    )


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mode=st.sampled_from(["ddp", "fsdp2"]),
    dims=st.tuples(
        st.integers(1, 300),
        st.integers(1, 300),
        st.integers(1, 300),
        st.integers(2, 5),
        st.integers(1, 40),
        st.integers(1, 64),
    ),  # fmt: skip
    world_size=st.integers(2, 8),
    optimizer=st.sampled_from(["adamw", "sgd"]),
)
# torch 2.8's FSDP2 held the previous unit's all-gather buffer through the next copy-out.
@example(mode="fsdp2", dims=(7, 1, 1, 2, 1, 1), world_size=2, optimizer="adamw")
def test_random_stacks_match_torchs_wrappers(mode, dims, world_size, optimizer):
    name = "stack:" + ",".join(str(d) for d in dims)
    assert estimated(mode, name, world_size, optimizer).step_peaks == oracle(
        mode, name, world_size, optimizer
    )


def test_fsdp2_holds_rank_zeros_shards():
    model, inputs = model_named("ragged")
    world = 4
    est = estimated("fsdp2", "ragged", world, "adamw")
    shard = sum(
        -(-p.shape[0] // world) * (p.numel() // p.shape[0]) * p.element_size()
        for p in model.parameters()
    )
    assert est.parameters == shard
    assert est.gradients == shard
    # AdamW: two moments per shard (the step counters are CPU scalars, 4 bytes each here).
    assert est.optimizer_state == 2 * shard + 4 * len(list(model.parameters()))
    single = estimate(model, inputs, optimizer=OPTIMIZERS["adamw"], loss_fn=loss_fn, device="cpu")
    assert single.parameters > est.parameters
    assert "fully_shard on 4 repeated blocks and the model" in " ".join(est.notes)


def test_ddp_adds_its_buckets_to_a_single_gpus_step():
    model, inputs = model_named("mlp")
    single = estimate(model, inputs, optimizer=OPTIMIZERS["sgd"], loss_fn=loss_fn, device="cpu")
    ddp = estimated("ddp", "mlp", 2, "sgd")
    trainable = sum(p.numel() * p.element_size() for p in model.parameters())
    assert ddp.parameters == single.parameters
    assert ddp.step_peaks[1] == single.step_peaks[1] + trainable
    assert ddp.collective_buffers == trainable


def test_on_cuda_the_first_steps_buckets_last_through_the_second():
    model, inputs = model_named("mlp")
    trainable = sum(p.numel() * p.element_size() for p in model.parameters())
    cpu = estimated("ddp", "mlp", 2, "sgd")
    cuda = estimate(model, inputs, optimizer=OPTIMIZERS["sgd"], loss_fn=loss_fn,
                    device="cuda", world_size=2, parallel="ddp")  # fmt: skip
    assert cpu.collective_buffers == trainable
    assert sorted(cpu.step_peaks) == [1, 2]
    # One bucket (under 1 MiB), rounded to the caching allocator's 512 bytes, twice: step 2
    # is the bound; a third step, the steady one, holds one set.
    bucket = -(-trainable // 512) * 512
    assert cuda.peak_step == 2 and cuda.collective_buffers == 2 * bucket
    assert sorted(cuda.step_peaks) == [1, 2, 3]
    assert cuda.step_peaks[2] - cuda.step_peaks[3] == bucket


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        ({"world_size": 0}, TypeError, "world_size must be an int >= 1, got 0"),
        ({"world_size": 2.0, "parallel": "ddp"}, TypeError, "world_size must be an int"),
        ({"world_size": 2}, ValueError, "world_size=2 needs a data-parallel mode"),
        ({"world_size": 2, "parallel": "zero3"}, ValueError, "parallel must be None, 'ddp'"),
    ],
)
def test_bad_arguments_name_the_parameter(kwargs, error, message):
    model = torch.nn.Linear(4, 4)
    with pytest.raises(error, match=message.replace("(", r"\(")):
        estimate(model, torch.zeros(2, 4), device="cpu", **kwargs)
    with pytest.raises(error, match=message.replace("(", r"\(")):
        max_batch_size(model, lambda n: torch.zeros(n, 4), budget="1MiB", device="cpu", **kwargs)


def test_a_per_rank_estimate_saves_loads_and_says_whose_it_is(tmp_path):
    est = estimated("fsdp2", "mlp", 2, "adamw")
    path = str(tmp_path / "est.json")
    est.save(path)
    loaded = memlab_rs.load(path)
    assert loaded == est
    text = loaded.text()
    assert "Note: per rank: rank 0 of 2 under FSDP2 (fully_shard per repeated block)" in text
    assert "collective buffers at the peak" in text
    assert "Per rank: rank 0 of 2 under FSDP2" in loaded._repr_html_()


def test_plan_tries_the_other_mode_per_rank():
    model, _ = model_named("mlp")

    def inputs(n: int) -> torch.Tensor:
        return torch.zeros(n, 100)

    p = plan(model, inputs, 64, budget="4MiB", device="cpu", world_size=2, parallel="ddp",
             loss_fn=loss_fn, optimizer=OPTIMIZERS["adamw"], precisions=[], optimizers={},
             try_checkpointing=False)  # fmt: skip
    assert [(r["axis"], r["parallel"]) for r in p.rows] == [
        ("baseline", "ddp"), ("size", "ddp"), ("size", "ddp"), ("parallel", "fsdp2"),
    ]  # fmt: skip
    for row in p.rows:
        est = estimate(
            model, inputs(row["size"]), optimizer=OPTIMIZERS["adamw"], loss_fn=loss_fn,
            device="cpu", world_size=2, parallel=row["parallel"],
        )  # fmt: skip
        assert row["peak_allocated"] == est.peak_allocated
        fits_one_more = max_batch_size(
            model, inputs, budget="4MiB", device="cpu", optimizer=OPTIMIZERS["adamw"],
            loss_fn=loss_fn, world_size=2, parallel=row["parallel"],
        )  # fmt: skip
        assert row["largest_size"] == fits_one_more
    # Sharding saves parameters, gradients and optimizer state: FSDP2 fits more.
    assert p.rows[3]["largest_size"] > p.rows[0]["largest_size"]
    assert p.best is not None and p.best["axis"] == "parallel"
    text = p.text()
    assert "parallel" in text.splitlines()[1] and "FSDP2" in text


@pytest.mark.parametrize("mode,name", [("fsdp2", "cnn"), ("fsdp2", "tinygpt"), ("ddp", "mlp")])
def test_the_recording_does_not_wait_for_the_garbage_collector(mode, name):
    """A reference cycle holding tensors frees them when the collector runs, which depends
    on the process's history: the same estimate with the collector off must be the same."""
    gc.disable()
    try:
        without = estimated(mode, name, 2, "adamw")
    finally:
        gc.enable()
    assert without.step_peaks == estimated(mode, name, 2, "adamw").step_peaks
