"""Two ranks on the CPU (gloo), launched the way users launch them: torchrun starting
`memlab-rs run` on a script that trains the bundled TinyGPT under DistributedDataParallel.
Rank 1 holds an extra tensor and allocates twice the scratch memory on purpose, so the
merged results must show that imbalance, with each rank's exact bytes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from console_script import MEMLAB_RS

import memlab_rs

MiB = 1 << 20

DDP_SCRIPT = """\
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import memlab_rs
from memlab_rs.models import TinyGPT

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(TinyGPT(vocab=64, dim=32, layers=2, heads=4, context=16))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
if rank == 1:
    extra = torch.zeros(1024, 1024)  # 4 MiB only rank 1 holds: the imbalance to find


def train_step(tokens):
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, 64), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=False)
    loss.backward()
    optimizer.step()
    scratch = torch.ones(256 * (rank + 1), 1024)  # 1 MiB on rank 0, 2 MiB on rank 1
    del scratch
    return loss.detach()


for _ in range(2):
    train_step(torch.randint(0, 64, (4, 17)))

# The Python API: each rank's report gathered to rank 0 over gloo and merged there.
report = memlab_rs.MemReporter(model).collect(device="cpu")
merged = memlab_rs.gather_results(report)
if rank == 0:
    merged.save("gathered.json")
else:
    assert merged is None
dist.destroy_process_group()
print(f"rank {rank} done")
"""


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torchrun --standalone (a free port) starting `memlab-rs run` on two ranks."""
    folder = tmp_path_factory.mktemp("ddp")
    (folder / "ddp.py").write_text(DDP_SCRIPT)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "--no-python", str(MEMLAB_RS), "run", "--device", "cpu", "--line", "train_step", "--report",
        "ddp.py",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        proc = subprocess.run(
            command, cwd=folder, capture_output=True, text=True, timeout=240, env=env
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun did not finish in 240 s (a hang): {e.stderr!r}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "rank 0 done" in proc.stdout and "rank 1 done" in proc.stdout
    return folder


def rank_files(folder: Path, kind: str) -> list[Path]:
    """{rank: file} of one kind of result: "json" (line profile) or "tensor_report.json"."""
    out = {}
    for path in folder.glob("memlab_rs.ddp.*.rank*.json"):
        parts = path.name.split(".")  # memlab_rs, ddp, <pid>, rank<R>, [tensor_report,] json
        if ".".join(parts[4:]) == kind:
            out[int(parts[3][len("rank") :])] = path
    return [out[r] for r in sorted(out)]


def merge(folder: Path, paths: list[Path], *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(MEMLAB_RS), "merge", *map(str, paths), *options],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_each_rank_saves_its_own_files_with_its_rank(ddp_run: Path):
    profiles = rank_files(ddp_run, "json")
    reports = rank_files(ddp_run, "tensor_report.json")
    assert len(profiles) == len(reports) == 2
    for rank, (profile_path, report_path) in enumerate(zip(profiles, reports)):
        profile, report = memlab_rs.load(profile_path), memlab_rs.load(report_path)
        for result in (profile, report):
            assert (result.meta["rank"], result.meta["world_size"]) == (rank, 2)
            assert result.meta["local_rank"] == rank
        assert profile.meta["device"] == "cpu" and profile.functions == ["train_step"]
        assert profile.text().startswith(f"# rank {rank} of 2 (cpu on ")
        assert report.to_text().startswith(f"# rank {rank} of 2 (")
        # the report names the script's globals: the DDP model, its optimizer, `extra`
        names = {row.name: row for row in report.rows}
        assert names["model.module.wpe.weight"].bytes == 16 * 32 * 4
        assert names["AdamW.model.module.wpe.weight.exp_avg"].bytes == 16 * 32 * 4
        assert ("extra" in names) == (rank == 1)


def test_merge_line_profiles_shows_the_rank_that_allocates_more(ddp_run: Path):
    proc = merge(ddp_run, rank_files(ddp_run, "json"), "-o", "merged_lines.json")
    assert proc.returncode == 0, proc.stderr
    merged = memlab_rs.load(ddp_run / "merged_lines.json")
    assert merged.kind == "merged_line_profile" and (merged.ranks, merged.world_size) == ([0, 1], 2)
    column = "allocated_bytes.all.allocated"
    (row,) = [r for r in merged.records() if "scratch = torch.ones" in r["code"]]
    assert (row[f"{column}.rank0"], row[f"{column}.rank1"]) == (MiB, 2 * MiB)
    assert (row[f"{column}.min"], row[f"{column}.max"], row[f"{column}.max_rank"]) == (
        MiB,
        2 * MiB,
        1,
    )
    assert (row["hits.min"], row["hits.max"]) == (2, 2)
    # the model's lines do the same work on both ranks: no rank stands out
    (same,) = [r for r in merged.records() if "optimizer.step()" in r["code"]]
    assert same[f"{column}.rank0"] == same[f"{column}.rank1"]
    assert proc.stdout.startswith("# merged line profile: ranks 0, 1 of 2\n\n## train_step\n")


def test_merge_tensor_reports_puts_the_imbalance_first(ddp_run: Path):
    proc = merge(ddp_run, rank_files(ddp_run, "tensor_report.json"), "-o", "merged.json")
    assert proc.returncode == 0, proc.stderr
    merged = memlab_rs.load(ddp_run / "merged.json")
    assert merged.kind == "merged_tensor_report"
    first = merged.records()[0]
    assert (first["name"], first["rank0"], first["rank1"], first["max_rank"]) == (
        "extra",
        0,
        4 * MiB,
        1,
    )
    lines = proc.stdout.splitlines()
    assert lines[0] == "# merged tensor report: ranks 0, 1 of 2"
    assert lines[3].split() == [
        "extra", "cpu", "(1024,", "1024)", "torch.float32", "0.00B", "2.00M", "4.00M", "1"
    ]  # fmt: skip
    weights = [r for r in merged.records() if r["name"] == "model.module.wpe.weight"]
    assert weights == [
        {
            "name": "model.module.wpe.weight",
            "device": "cpu",
            "dtype": "torch.float32",
            "shape": "(16, 32)",
            "min": 2048,
            "median": 2048,
            "max": 2048,
            "max_rank": 0,
            "rank0": 2048,
            "rank1": 2048,
        }
    ]
    assert_totals_are_the_rows_and_extra_is_the_imbalance(merged, first)


def assert_totals_are_the_rows_and_extra_is_the_imbalance(merged, extra: dict) -> None:
    """Each rank's total is the sum of its rows, and rank 1's 4 MiB ``extra`` is the only
    imbalance. (Loaded CI machines once saw 24 bytes, once 22,842 bytes more on rank 1:
    gather_object's buffers, still held by gloo's worker when the report was taken;
    gather_results now empties its own buffers.)"""
    records = merged.records()
    (total,) = merged.totals.values()
    assert total == [sum(r[f"rank{i}"] or 0 for r in records) for i in (0, 1)]
    others = [r for r in records if r != extra and r["rank0"] != r["rank1"]]
    assert others == []
    assert total[1] - total[0] == 4 * MiB


def test_gather_results_over_gloo_merges_on_rank_0(ddp_run: Path):
    gathered = memlab_rs.load(ddp_run / "gathered.json")
    assert gathered.kind == "merged_tensor_report" and gathered.ranks == [0, 1]
    records = gathered.records()
    rows = {r["name"]: r for r in records}
    assert rows["module.wpe.weight"]["rank0"] == rows["module.wpe.weight"]["rank1"] == 2048
    # rank 1's `extra` is unnamed here (the reporter knows only the model): matched by
    # shape and dtype, not by the number the reporter gave it, and first as the imbalance
    first = records[0]
    assert (first["name"], first["shape"], first["rank0"], first["rank1"], first["max_rank"]) == (
        "(unnamed)",
        "(1024, 1024)",
        0,
        4 * MiB,
        1,
    )
    # the optimizer's state, unnamed too, is the same on both ranks: exp_avg and
    # exp_avg_sq of the two blocks' (128, 32) weights
    (state,) = [r for r in records if r["shape"] == "(128, 32)" and r["name"] == "(unnamed)"]
    assert state["rank0"] == state["rank1"] == 4 * 128 * 32 * 4
    assert_totals_are_the_rows_and_extra_is_the_imbalance(gathered, first)
