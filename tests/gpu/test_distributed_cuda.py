"""Two GPUs, NCCL (run on the two-GPU machine): torchrun starting `memlab-rs run` on GPT-2
(random weights) under DistributedDataParallel and under FSDP2's `fully_shard`. Each rank
profiles its own GPU; its files carry its rank; the tensor reports count exactly the
optimizer state each rank holds (the script computes it from the tensors themselves); and
the merge shows the state replicated under DDP and sharded under FSDP2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from console_script import MEMLAB_RS

import memlab_rs

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
    ),
]


SCRIPT = """\
import json, sys
import torch
import torch.distributed as dist
import transformers

mode = sys.argv[1]
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
torch.manual_seed(0)
config = transformers.GPT2Config(
    n_layer=2, n_embd=256, n_head=4, vocab_size=50304, n_positions=128
)
model = transformers.GPT2LMHeadModel(config).cuda()
if mode == "ddp":
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
else:
    from torch.distributed.fsdp import fully_shard

    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(0, 50304, (2, 64), device="cuda")


def train_step():
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


for _ in range(2):
    train_step()
torch.cuda.synchronize()


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


# The truth, from the tensors themselves: the optimizer state this rank holds on its GPU,
# each storage as the caching allocator holds it (rounded up to 512 bytes).
state = [local(v) for s in optimizer.state.values() for k, v in s.items() if k != "step"]
storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in state}
truth = {
    "device": str(state[0].device),
    "state_bytes": sum(-(-n // 512) * 512 for n in storages.values()),
    "state_storage_bytes": sum(storages.values()),
}
with open(f"truth.{mode}.rank{rank}.json", "w") as f:
    json.dump(truth, f)
dist.barrier()
dist.destroy_process_group()
"""


def launch(folder: Path, mode: str) -> None:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "--no-python", str(MEMLAB_RS), "run", "--line", "train_step", "--report",
        "-o", f"{mode}.json", "gpt2.py", mode,
    ]  # fmt: skip
    try:
        proc = subprocess.run(
            command, cwd=folder, capture_output=True, text=True, timeout=420, env=dict(os.environ)
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun did not finish in 420 s (a hang): {e.stderr!r}")
    assert proc.returncode == 0, proc.stderr[-6000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("gpt2_nccl")
    (folder / "gpt2.py").write_text(SCRIPT)
    for mode in ("ddp", "fsdp"):
        launch(folder, mode)
    return folder


def files(folder: Path, mode: str, kind: str) -> list[Path]:
    """Each rank's file of one kind ("" for the line profile, "tensor_report"), by rank."""
    found = sorted(p for p in folder.glob("*.json") if p.name.startswith(mode) and "rank" in p.name)
    chosen = [p for p in found if ("tensor_report" in p.name) == (kind == "tensor_report")]
    return sorted(chosen, key=lambda p: memlab_rs.load(p).meta["rank"])


def state_rows(report) -> int:
    """Bytes of the report's optimizer-state rows (AdamW's exp_avg and exp_avg_sq)."""
    return sum(r.bytes for r in report.rows if ".exp_avg" in r.name)


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_each_rank_profiles_its_own_gpu(runs: Path, mode: str):
    profiles, reports = files(runs, mode, ""), files(runs, mode, "tensor_report")
    assert len(profiles) == len(reports) == 2, sorted(p.name for p in runs.iterdir())
    for rank, (profile_path, report_path) in enumerate(zip(profiles, reports)):
        profile, report = memlab_rs.load(profile_path), memlab_rs.load(report_path)
        assert profile.meta["device"] == f"cuda:{rank}"
        assert (profile.meta["rank"], profile.meta["world_size"]) == (rank, 2)
        assert profile.text().startswith(f"# rank {rank} of 2 (cuda:{rank}")
        assert profile.functions == ["train_step"]
        (step_line,) = [
            r for r in profile.records() if r["code"].strip() == "optimizer.step()"
        ]
        assert step_line["hits"] == 2
        truth = json.loads((runs / f"truth.{mode}.rank{rank}.json").read_text())
        assert truth["device"] == f"cuda:{rank}"
        # The report counts exactly the state this rank holds, on this rank's GPU.
        assert state_rows(report) == truth["state_bytes"]
        assert {r.device for r in report.rows if ".exp_avg" in r.name} == {f"cuda:{rank}"}


def test_merge_shows_the_state_replicated_under_ddp_and_sharded_under_fsdp2(runs: Path):
    merged = {}
    for mode in ("ddp", "fsdp"):
        out = runs / f"merged_{mode}.json"
        reports = [str(p) for p in files(runs, mode, "tensor_report")]
        proc = subprocess.run(
            [str(MEMLAB_RS), "merge", *reports, "-o", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        merged[mode] = [r for r in memlab_rs.load(out).records() if ".exp_avg" in r["name"]]
        assert merged[mode], f"no optimizer state rows in the merged {mode} report"
    # DDP: every rank holds the whole state, the same bytes on both.
    for row in merged["ddp"]:
        assert row["rank0"] == row["rank1"] > 0, row
    ddp = [json.loads((runs / f"truth.ddp.rank{r}.json").read_text()) for r in (0, 1)]
    fsdp = [json.loads((runs / f"truth.fsdp.rank{r}.json").read_text()) for r in (0, 1)]
    # FSDP2: each rank holds its shard of every state tensor (both ranks have rows), and
    # the shards add up to one copy of the state.
    shards = [row for row in merged["fsdp"] if row["max"] > 0]  # DTensor wrappers hold 0
    assert shards and all(row["rank0"] > 0 and row["rank1"] > 0 for row in shards)
    assert sum(r["rank0"] for r in merged["fsdp"]) == fsdp[0]["state_bytes"]
    assert sum(r["rank1"] for r in merged["fsdp"]) == fsdp[1]["state_bytes"]
    full = ddp[0]["state_storage_bytes"]
    assert fsdp[0]["state_storage_bytes"] + fsdp[1]["state_storage_bytes"] >= full
    assert max(f["state_storage_bytes"] for f in fsdp) < 0.6 * full
