"""The out-of-memory post-mortem on a real GPU, with real out-of-memory errors made of plain
allocations (never managed memory): one request larger than the card; an error caused by
fragmentation, whose advice (expandable segments) the test then follows and the same script
completes; GPT-2 training with a batch that does not fit, whose named batch the test then
trains with; and, under torchrun with two GPUs, one rank that runs out while the other goes
on undisturbed. Exact bytes wherever the allocator gives them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import memlab_rs

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

MiB = 1 << 20


def round_large(n: int) -> int:
    """What the caching allocator asks of the driver for a request of n >= 10 MiB bytes:
    n rounded to 512 bytes, then to 2 MiB."""
    n = -(-n // 512) * 512
    return -(-n // (2 * MiB)) * (2 * MiB)


def test_a_request_larger_than_the_card_is_named_with_the_tensors_alive(tmp_path: Path):
    model = torch.nn.Linear(1024, 1024).cuda()
    activations = torch.randn(256, 1024, device="cuda")
    free, total = torch.cuda.mem_get_info()
    request = total + 3 * 512 + 7  # more than the card, not a round number
    before = torch.cuda.memory_stats()["allocated_bytes.all.allocated"]
    with pytest.raises(torch.OutOfMemoryError) as caught:
        with memlab_rs.oom_guard(dir=tmp_path, model={"model": model}, summary=False) as guard:
            torch.empty(request, dtype=torch.uint8, device="cuda")
    # the error reached us unchanged, and the guard allocated nothing on the device
    assert "Tried to allocate" in str(caught.value)
    assert torch.cuda.memory_stats()["allocated_bytes.all.allocated"] == before
    pm = guard.last
    assert pm is not None and guard.path is not None and guard.path.exists()
    assert memlab_rs.load(guard.path).to_data() == pm.to_data()
    assert pm.request["allocation_bytes"] == round_large(request)
    assert pm.request["source"] == "observer"
    assert pm.cuda["total"] == total
    assert pm.cuda["allocated"] == torch.cuda.memory_allocated()
    names = {t["name"]: t["bytes"] for t in pm.tensors}
    assert names["model.weight"] == 1024 * 1024 * 4
    assert names["model.bias"] == 1024 * 4
    assert 256 * 1024 * 4 in [t["bytes"] for t in pm.tensors]
    assert "capacity" in pm.advice_kinds()
    assert "fragmentation" not in pm.advice_kinds()
    assert memlab_rs.load(guard.path).to_data()["error"].startswith("OutOfMemoryError")
    del activations


FRAGMENT = """\
import json, sys, torch, memlab_rs
MiB = 1 << 20
big = []
try:
    while True:  # the card filled with 60 MiB segments
        big.append(torch.empty(60 * MiB, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError:
    pass
n = len(big)
del big  # every segment cached, whole
small, filler = [], []
for _ in range(n):  # each segment carved: 8 MiB kept, then 52 MiB
    small.append(torch.empty(8 * MiB, dtype=torch.uint8, device="cuda"))
    filler.append(torch.empty(52 * MiB, dtype=torch.uint8, device="cuda"))
del filler  # 52 MiB free in every segment, none of them whole
out = {"kept": len(small)}
try:
    with memlab_rs.oom_guard(dir=sys.argv[1]) as guard:
        big = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
    out["completed"] = True
except torch.OutOfMemoryError:
    out["completed"] = False
    snap = torch.cuda.memory_snapshot()
    free = [b["size"] for s in snap if s["segment_type"] == "large" and s["stream"] == 0
            for b in s["blocks"] if b["state"] == "inactive"]
    out["free_large"] = sum(free)
    out["largest_free"] = max(free)
    out["path"] = str(guard.path)
print(json.dumps(out))
"""


def run_fragment(folder: Path, conf: str | None) -> dict:
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    (folder / "fragment.py").write_text(FRAGMENT)
    proc = subprocess.run(
        [sys.executable, "fragment.py", str(folder)], cwd=folder, env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "stderr": proc.stderr}


def test_fragmentation_is_named_and_expandable_segments_then_lets_the_script_finish(
    tmp_path: Path,
):
    first = run_fragment(tmp_path, None)
    assert first["completed"] is False
    pm = memlab_rs.load(first["path"])
    kinds = pm.advice_kinds()
    assert "fragmentation" in kinds and "expandable_segments" in kinds, pm.text()
    frag = next(a for a in pm.advice if a["kind"] == "fragmentation")
    assert frag["bytes"] == first["free_large"]  # exact: the allocator's own snapshot
    assert first["largest_free"] == 52 * MiB and first["free_large"] >= 100 * MiB
    assert pm.request["allocation_bytes"] == 100 * MiB
    assert "expandable_segments:True" in first["stderr"]  # the summary on stderr
    # the advice, followed: the same script completes
    second = run_fragment(tmp_path, "expandable_segments:True")
    assert second["completed"] is True, second


GPT2 = """\
import json, sys, torch, transformers, memlab_rs
torch.manual_seed(0)
config = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12)
model = transformers.GPT2LMHeadModel(config).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
T = 1024
def make_inputs(b):
    ids = torch.randint(0, config.vocab_size, (b, T), device="cuda")
    return {"input_ids": ids, "labels": ids}
def step(b):
    loss = model(**make_inputs(b)).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
step(1)  # the optimizer's state exists, as in a job that has been training
batch = int(sys.argv[2])
out = {}
try:
    with memlab_rs.oom_guard(dir=sys.argv[1], model=model, optimizer=opt, history=True,
                             make_inputs=make_inputs, batch_size=batch) as guard:
        step(batch)
    out["completed"] = True
except torch.OutOfMemoryError:
    out["completed"] = False
    out["path"] = str(guard.path)
print(json.dumps(out))
"""


def test_gpt2_with_a_batch_too_big_names_the_activations_modules_and_a_batch_that_trains(
    tmp_path: Path,
):
    pytest.importorskip("transformers")
    (tmp_path / "gpt2.py").write_text(GPT2)

    def run(batch: int) -> dict:
        proc = subprocess.run(
            [sys.executable, "gpt2.py", str(tmp_path), str(batch)], cwd=tmp_path,
            capture_output=True, text=True, timeout=480,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    total = torch.cuda.mem_get_info()[1]
    batch = 256 if total > 100 << 30 else 128
    failed = run(batch)
    assert failed["completed"] is False
    pm = memlab_rs.load(failed["path"])
    data = pm.to_data()
    kinds = pm.advice_kinds()
    assert "activations" in kinds and data["autograd"]["saved_bytes"] > 0, pm.text()
    assert "checkpointing" in kinds and data["by_module"], pm.text()
    assert any("transformer.h." in m["location"] for m in data["by_module"][:3]), pm.text()
    # the biggest live tensors are the step's activations, named by the frames holding them
    assert any(":" in t["name"] for t in data["tensors"]), [t["name"] for t in data["tensors"]]
    sizes = [t["bytes"] for t in data["tensors"]]
    assert sizes == sorted(sizes, reverse=True)
    assert data["batch"] is not None, pm.text()
    assert data["batch"]["current"] == batch
    fits = data["batch"]["fits"]
    assert 1 <= fits < batch, data["batch"]
    assert run(fits)["completed"] is True  # the batch it named trains


RANKS = """\
import json, os, sys, torch, torch.distributed as dist, memlab_rs
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.cuda.set_device(rank)
memlab_rs.oom_guard.install(dir=sys.argv[1])
x = torch.randn(2048, 2048, device="cuda")
out = {"rank": rank}
if rank == 1:
    try:
        torch.empty(torch.cuda.mem_get_info()[1] * 2, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        out["oom"] = True
y = x @ x  # the other rank's work goes on
out["sum_ok"] = bool(torch.allclose(y, x @ x))
dist.barrier()
memlab_rs.oom_guard.uninstall()
with open(os.path.join(sys.argv[1], f"rank{rank}.out.json"), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_under_torchrun_only_the_rank_that_ran_out_writes_a_post_mortem(tmp_path: Path):
    (tmp_path / "ranks.py").write_text(RANKS)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "ranks.py", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    outs = [json.loads((tmp_path / f"rank{r}.out.json").read_text()) for r in (0, 1)]
    assert outs[0] == {"rank": 0, "sum_ok": True}
    assert outs[1] == {"rank": 1, "oom": True, "sum_ok": True}
    written = sorted(tmp_path.glob("memlab_oom_*.json"))
    assert len(written) == 1 and "_rank1_" in written[0].name, written
    pm = memlab_rs.load(written[0])
    assert pm.to_data()["rank"] == 1 and pm.to_data()["world_size"] == 2
    assert pm.device == "cuda:1"
    assert "rank 1 of 2" in pm.text()


EARLY = """\
import glob, json, sys, torch, memlab_rs
memlab_rs.oom_guard.install(dir=sys.argv[1], summary=False)
initialised = torch.cuda.is_initialized()
x = torch.ones(1, device="cuda")  # CUDA's first use: the observer is attached now
try:
    torch.empty(torch.cuda.mem_get_info()[1] * 2, dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError:  # caught: only the observer can see it
    pass
memlab_rs.oom_guard.uninstall()
print(json.dumps({"initialised": initialised,
                  "written": len(glob.glob(sys.argv[1] + "/memlab_oom_*.json"))}))
"""


def test_a_guard_installed_before_cuda_is_used_does_not_initialise_it_nor_miss_a_caught_oom(
    tmp_path: Path,
):
    """torch's binding initialises CUDA before it attaches an observer (older ones attach
    to no allocator when CUDA is not initialised yet): the guard queues its observer for
    CUDA's first use, so installing it initialises nothing and a caught OOM is still seen."""
    (tmp_path / "early.py").write_text(EARLY)
    proc = subprocess.run(
        [sys.executable, "early.py", str(tmp_path)], cwd=tmp_path,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"initialised": False, "written": 1}
