"""memlab_rs.trace on CUDA: Max mem equals torch's max_memory_allocated over the region,
the rows add up to it, the rows and tags name GPT-2's attention and MLP, and the user's own
history setting survives; files are shown short, what was alive at the start is named by
tensor, every module view agrees, and Untrackable is what the driver counts beyond the peak."""

from __future__ import annotations

import os
import re

import pytest
import torch
from trace_views import assert_views_agree, nbytes

from memlab_rs import LineProfiler, trace
from memlab_rs._sources import cuda_history

pytestmark = pytest.mark.cuda

MiB = 1 << 20


def history_on() -> bool:
    return cuda_history.history_enabled()  # (torch segfaults if asked before CUDA starts)


@pytest.fixture(scope="module")
def gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12)
    model = transformers.GPT2LMHeadModel(config).cuda()
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, config.vocab_size, (8, 512), device="cuda")

    def step():
        model(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # optimizer state exists from here on, as in a training loop
    torch.cuda.synchronize()
    return model, step


def test_gpt2_8x512_max_mem_is_max_memory_allocated_and_rows_add_up(gpt2):
    model, step = gpt2
    assert not history_on()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with trace.Tracer(device="cuda:0", model=model, tag_modules=True) as tr:
        step()
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    assert not history_on()  # turned back off, as it was
    result = tr.result
    assert result.notices("cuda:0") == []
    assert result.max_mem("cuda:0") == peak
    rows = result.rows("cuda:0")
    assert sum(r.bytes for r in rows) == peak
    top = " ".join(r.location for r in rows[:8])
    assert "modeling_gpt2.py" in top or "sdpa_attention.py" in top, result.text()
    # Module tags name the blocks' attention and MLP.
    tags = [r.location for r in result.module_rows("cuda:0")]
    assert any(re.search(r"transformer\.h\.\d+\.attn", t) for t in tags), tags[:20]
    assert any(re.search(r"transformer\.h\.\d+\.mlp", t) for t in tags), tags[:20]
    assert any(t.startswith("backward:") for t in tags)
    # Keyword groups: Untrackable is what the driver sees used beyond the tracked bytes.
    groups = dict(result.keywords({"attention": ["attn"], "mlp": ["mlp"]}))
    assert list(groups) == ["attention", "mlp", "Others", "Untrackable"]
    assert groups["attention"] > 0 and groups["mlp"] > 0
    assert groups["Untrackable"] > 0  # the CUDA context and the cache at least
    assert groups["attention"] + groups["mlp"] + groups["Others"] == peak


def test_a_users_history_setting_is_kept_and_their_history_too():
    torch.cuda.memory._record_memory_history(
        "all", context="all", stacks="python", max_entries=50000
    )
    try:
        before = torch.empty(MiB, device="cuda")
        with trace.Tracer(device="cuda") as tr:
            x = torch.empty(4 * MiB, device="cuda")  # 16 MiB
        assert history_on()
        entries = torch.cuda.memory._snapshot()["device_traces"][0]
        assert any(e["action"] == "alloc" and e["addr"] == before.data_ptr() for e in entries)
        rows = tr.result.rows(0)
        mine = [r for r in rows if "test_trace_cuda.py" in r.location]
        assert mine and mine[0].bytes == 16 * MiB and mine[0].count == 1
        del x, before
    finally:
        torch.cuda.memory._record_memory_history(None)
    assert not history_on()


def test_a_start_that_fails_turns_the_history_back_off():
    from memlab_rs.trace.tags import ModuleTagger

    assert not history_on()
    with ModuleTagger():  # another tagger is installed: the tracer's cannot be
        failed = trace.Tracer(device="cuda", tag_modules=True)
        with pytest.raises(RuntimeError, match="another ModuleTagger is installed"):
            failed.start()
        assert not history_on()
    # A user's own history stays on through a failed start.
    torch.cuda.memory._record_memory_history("all", context="alloc", stacks="python")
    try:
        with ModuleTagger():
            with pytest.raises(RuntimeError, match="another ModuleTagger is installed"):
                trace.Tracer(device="cuda", tag_modules=True).start()
        assert history_on()
    finally:
        torch.cuda.memory._record_memory_history(None)
    with failed:
        x = torch.empty(4 * MiB, device="cuda")  # 16 MiB
    assert failed.result.max_mem("cuda:0") >= 16 * MiB
    assert not history_on()
    del x


def test_untraced_is_what_was_allocated_before():
    keep = torch.empty(3 * MiB, device="cuda")  # 12 MiB, allocated before tracing
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with trace.Tracer(device="cuda") as tr:
        a = torch.empty(MiB, device="cuda")
        b = torch.empty(2 * MiB, device="cuda")
        del a
        c = torch.empty(512, device="cuda")
    summary = tr.result.summary(0)
    assert summary["start_allocated"] == start
    assert summary["max_mem"] == torch.cuda.max_memory_allocated()
    rows = {r.location: r for r in tr.result.rows(0)}
    assert rows["untraced"].bytes == start
    del keep, b, c


def test_ring_buffer_overflow_is_said_in_the_report():
    with trace.Tracer(device="cuda", max_entries=20) as tr:
        xs = [torch.empty(1000 + i, device="cuda") for i in range(50)]
        del xs
    assert any("ring buffer" in n or "max_entries" in n for n in tr.result.notices(0))
    assert "Note:" in tr.result.text()


def test_start_stop_tracing_report_stats(capsys):
    trace.switch_allocator()
    trace.start_tracing()
    x = torch.empty(MiB, device="cuda")
    trace.stop_tracing()
    trace.report_stats()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Max mem: ")
    assert out[2] == "Mem, Cumulative Mem, Median, Count, Location"
    assert any("test_trace_cuda.py" in line for line in out[3:])
    del x


def test_snapshot_does_not_import_inductor_and_restores_torch():
    import subprocess
    import sys

    code = (
        "import sys, torch, memlab_rs.trace as t\n"
        "with t.Tracer(device='cuda') as tr:\n"
        "    x = torch.empty(1024, device='cuda')\n"
        "print('torch._inductor' in sys.modules, hasattr(torch, '_inductor') and "
        "type(torch._inductor).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == "False"


def test_line_profiler_peak_live_column():
    def work():
        a = torch.empty(2 * MiB, device="cuda")  # 8 MiB, alive at the peak
        b = torch.empty(MiB, device="cuda")  # 4 MiB, freed before the peak
        del b
        c = torch.empty(3 * MiB, device="cuda")  # 12 MiB, the peak
        return a, c

    torch.cuda.empty_cache()
    with LineProfiler(work, device="cuda", peak_live=True) as lp:
        out = work()
    records = lp.display(columns=["active_bytes.all.peak", "peak_live"]).records()
    by_code = {r["code"].strip().split("  #")[0]: r["peak_live"] for r in records}
    # The allocator's blocks: the request, or a cached block up to 1 MiB larger.
    mine = [r.bytes for r in lp.trace_result.rows(0) if "test_trace_cuda.py" in r.location]
    a = by_code['a = torch.empty(2 * MiB, device="cuda")']
    c = by_code['c = torch.empty(3 * MiB, device="cuda")']
    assert 8 * MiB <= a <= 9 * MiB and 12 * MiB <= c <= 13 * MiB
    assert sorted([a, c]) == sorted(mine)
    assert by_code['b = torch.empty(MiB, device="cuda")'] == 0
    del out


def test_saved_trace_loads_the_same_on_another_machine(tmp_path):
    with trace.Tracer(device="cuda") as tr:
        x = torch.empty(MiB, device="cuda")
        y = x * 2
    path = tmp_path / "t.pickle"
    tr.result.save(path)
    assert trace.load(path).text() == tr.result.text()
    del x, y


# -- files shown short; what was alive at the start named; every module view agreeing --------


def cuda_step():
    return torch.empty(1 << 20, device="cuda")  # 4 MiB, alive at the peak


def allocator_block(tensor: torch.Tensor) -> int:
    """The bytes of the caching allocator's block holding ``tensor``, from torch's own
    snapshot: 4 MiB for a 4 MiB tensor in a fresh cache, more when a cached free block was
    reused whole (a large block is split only when over 1 MiB would remain)."""
    for segment in torch.cuda.memory_snapshot():
        address = segment["address"]
        for block in segment["blocks"]:
            if address == tensor.untyped_storage().data_ptr():
                return block["size"]
            address += block["size"]
    raise AssertionError("no allocator block holds the tensor")


def test_a_cuda_recording_saves_its_working_directory_and_shows_files_short():
    import inspect

    with trace.Tracer(device="cuda:0") as tr:
        out = cuda_step()
    assert tr.result.snapshot["memlab_rs"]["cwd"] == os.getcwd()
    line = inspect.getsourcelines(cuda_step)[1] + 1
    relative = os.path.relpath(__file__)
    shown = __file__ if relative.startswith("..") else relative
    rows = {r.location: r.bytes for r in tr.result.rows("cuda:0")}
    block = allocator_block(out)
    assert rows[f"{shown}:{line} (cuda_step)"] == block >= 4 << 20
    full = trace.load(tr.result.snapshot, paths="full")
    assert {r.location: r.bytes for r in full.rows(0)}[f"{__file__}:{line} (cuda_step)"] == block
    del out


def test_cuda_start_is_named_by_tensor():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU()).cuda()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(256, 1024, device="cuda")

    def train_step():
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    train_step()
    torch.cuda.synchronize()
    with trace.Tracer(device="cuda:0", model=model) as tr:
        train_step()
        torch.cuda.synchronize()
    rows = {r.location: r.bytes for r in tr.result.module_rows("cuda:0")}
    w = model[0].weight
    state = opt.state[w]
    # Each row is the allocator's block of its 4 MiB tensor (exactly 4 MiB in a fresh cache;
    # a cached 5 MiB block is reused whole when the suite ran before).
    assert nbytes(w) == 4 << 20
    assert rows["untraced:0.weight"] == allocator_block(w)
    assert rows["untraced:AdamW.0.weight.exp_avg"] == allocator_block(state["exp_avg"])
    assert rows["untraced:AdamW.0.weight.exp_avg_sq"] == allocator_block(state["exp_avg_sq"])
    # AdamW's step counters are CPU tensors: not on this device, not named here.
    assert not any(k.endswith(".step") for k in rows)
    assert_views_agree(tr.result, "cuda:0")


def test_cuda_untrackable_is_what_the_driver_counts_beyond_the_peak():
    from memlab_rs import _core

    x = torch.ones(1 << 20, device="cuda")
    with trace.Tracer(device="cuda:0") as tr:
        y = x * 2
        torch.cuda.synchronize()
    before = _core.driver_device_memory(0)[0]
    groups = dict(tr.result.keywords({"all": ["untraced"]}))
    after = _core.driver_device_memory(0)[0]
    assert groups["Untrackable"] >= 0
    assert min(before, after) <= sum(groups.values()) <= max(before, after)
    del x, y


def test_a_cuda_step_with_module_tags_every_view_agrees():
    """On CUDA the backward runs on autograd's device thread, which has no Python stack:
    its untagged allocations are (untagged), and the log lists exactly those."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
    ).cuda()
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(512, 256, device="cuda")

    def train_step():
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    train_step()
    torch.cuda.synchronize()
    with trace.Tracer(device="cuda:0", model=model, tag_modules=True) as tr:
        train_step()
        torch.cuda.synchronize()
    keys = [r.location for r in tr.result.module_rows("cuda:0")]
    assert "untraced:0.weight" in keys and "untraced:Adam.0.weight.exp_avg" in keys
    assert_views_agree(tr.result, "cuda:0")
