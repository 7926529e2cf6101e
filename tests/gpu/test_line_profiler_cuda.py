"""The line profiler on CUDA: per-line numbers equal what torch reports for the same lines.

The reference runs the same statements with ``torch.cuda.memory_stats()`` and
``torch.cuda.reset_peak_memory_stats()`` between them (pytorch_memlab's definition of a
line's peak), from the same allocator state (``empty_cache()`` before each run).
"""

from __future__ import annotations

import re

import pytest
import torch

from memlab_rs import LineProfiler, _core
from memlab_rs.line_profiler import columns as line_columns

pytestmark = pytest.mark.cuda

MiB = 1 << 20
COLUMNS = (
    "active_bytes.all.peak",
    "reserved_bytes.all.peak",
    "allocated_bytes.all.allocated",
    "active_bytes.all.current",
)


def work(dev):
    a = torch.empty(3 * MiB, dtype=torch.uint8, device=dev)
    b = torch.empty(700, 1024, device=dev)
    c = a.float()
    del a
    d = (b @ b.T).sum()
    e = torch.empty(10, device=dev)
    return c, d, e


def reference(dev):
    """`work`, statement by statement, reading torch's own statistics after each."""
    seen = []
    last = {}

    def mark():
        # peaks since the last reset, counters as growth since the last mark
        stats = torch.cuda.memory_stats(dev)
        row = {c: stats[c] for c in COLUMNS}
        for c in COLUMNS:
            if c.endswith((".allocated", ".freed")):
                row[c] = stats[c] - last.get(c, 0)
                last[c] = stats[c]
        seen.append(row)
        torch.cuda.reset_peak_memory_stats(dev)

    mark()
    seen.clear()
    a = torch.empty(3 * MiB, dtype=torch.uint8, device=dev)
    mark()
    b = torch.empty(700, 1024, device=dev)
    mark()
    c = a.float()
    mark()
    del a
    mark()
    d = (b @ b.T).sum()
    mark()
    e = torch.empty(10, device=dev)
    mark()
    return seen, (c, d, e)


def fresh(dev):
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()


def profile_and_compare(dev):
    torch.empty(1, device=dev)  # CUDA and cuBLAS up before both runs
    (torch.ones(8, 8, device=dev) @ torch.ones(8, 8, device=dev)).sum()
    for _ in range(2):  # the first run warms up whatever torch caches on first use
        fresh(dev)
        expected, kept = reference(dev)
        del kept
    fresh(dev)
    with LineProfiler(work, target_gpu=dev.index) as lp:
        reader = lp.stats_reader
        kept = work(dev)
    assert lp.device == f"cuda:{dev.index}"
    records = [r for r in lp.display(work, COLUMNS).records() if r["hits"]]
    body = [r for r in records if r["line"] > work.__code__.co_firstlineno][:-1]  # not `return`
    assert body[0]["code"].strip().startswith("a = torch.empty(3 * MiB")
    got = [{c: r[c] for c in COLUMNS} for r in body]
    assert got == expected, "\n".join(f"{g}\n{w}\n" for g, w in zip(got, expected))
    del kept
    return reader


def test_lines_match_torch_statistics():
    reader = profile_and_compare(torch.device("cuda:0"))
    # The allocator's fields were located and used (not the slower binding).
    assert reader == "allocator memory", _core._cuda_direct_why_not(0)


def test_lines_match_torch_statistics_through_the_binding(script):
    out = script(
        f"""
        import os, sys
        os.environ["MEMLAB_RS_CUDA_STATS"] = "binding"
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        import torch
        from test_line_profiler_cuda import profile_and_compare
        print(profile_and_compare(torch.device("cuda:0")))
        """
    )
    assert out.strip() == "torch._C._cuda_memoryStats"


def test_cuda_initialised_inside_the_profiled_function(script):
    out = script(
        """
        import torch
        from memlab_rs import LineProfiler

        def first_use():
            x = torch.empty(256, 1024, device="cuda")
            y = torch.empty(512, 1024, device="cuda")
            return x, y

        assert not torch.cuda.is_initialized()
        with LineProfiler(first_use) as lp:
            kept = first_use()
        for r in lp.display(columns=("allocated_bytes.all.allocated",)).records():
            print(r["code"].strip(), r["allocated_bytes.all.allocated"])
        """
    )
    assert 'y = torch.empty(512, 1024, device="cuda") 2097152' in out
    assert 'x = torch.empty(256, 1024, device="cuda") 1048576' in out


def test_peak_memory_stats_keep_the_true_peak():
    dev = torch.device("cuda:0")

    def spike():
        big = torch.empty(64 * MiB, dtype=torch.uint8, device=dev)
        del big
        small = torch.empty(MiB, dtype=torch.uint8, device=dev)
        return small

    base = torch.cuda.memory_allocated(dev)
    with LineProfiler(spike) as lp:
        kept = spike()
    assert lp.peak_memory_stats()["allocated_bytes.all.peak"] >= base + 64 * MiB
    del kept


def test_importing_does_not_initialise_cuda(script):
    out = script("import torch, memlab_rs; print(torch.cuda.is_initialized())")
    assert out.strip() == "False"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (nvidia-h200-x2)")
def test_set_target_gpu_switches_inside_a_profiled_function(script):
    out = script(
        """
        import torch
        from memlab_rs import profile, set_target_gpu, global_line_profiler

        @profile
        def two_devices():
            a = torch.empty(256, 1024, device="cuda:0")
            set_target_gpu(1)
            b = torch.empty(512, 1024, device="cuda:1")
            c = torch.empty(1024, 1024, device="cuda:0")
            return a, b, c

        set_target_gpu(torch.device("cuda:0"))
        kept = two_devices()
        lp = global_line_profiler()
        for r in lp.display(columns=("allocated_bytes.all.allocated",)).records():
            print(repr(r["code"].strip()), r["allocated_bytes.all.allocated"])
        """
    )
    lines = dict(line.rsplit(" ", 1) for line in out.splitlines() if line.startswith("'"))
    assert lines["'a = torch.empty(256, 1024, device=\"cuda:0\")'"] == str(MiB)
    assert lines["'b = torch.empty(512, 1024, device=\"cuda:1\")'"] == str(2 * MiB)
    assert lines["'c = torch.empty(1024, 1024, device=\"cuda:0\")'"] == "0"  # not GPU 1


# The direct reader (src/line_profiler/cuda_direct.rs) against torch's binding. Each runs in
# a fresh interpreter: the reader's state (located fields, fallbacks, check counts) is
# per process.

SHIFTED_BINDING = """
import os, re
os.environ["MEMLAB_RS_CUDA_REVALIDATE_SAMPLES"] = "{every}"
import torch
from memlab_rs import LineProfiler, _core

real = torch._C._cuda_memoryStats
armed = False


def shifted(device):
    # torch's answer, 512 bytes off once armed: memory and torch then disagree, and
    # nothing in the allocator is touched.
    stats = real(device)
    if armed:
        stats["allocated_bytes"]["all"]["current"] += 512
    return stats


torch._C._cuda_memoryStats = shifted  # before any profiler takes the binding


def lines(n):
    x = torch.empty(1024, device="cuda")
    for _ in range(n):
        y = x + 1
        del y
    return x


def until_direct(lp):
    for _ in range(20):
        if lp.stats_reader == "allocator memory":
            return
        lines(1)
    raise SystemExit(f"never read from memory: {{_core._cuda_direct_why_not(0)}}")


torch.empty(1, device="cuda")  # CUDA up and something allocated: the reader can be found
"""

NOTICE = re.compile(
    r"cuda:0 statistics read through torch\._C\._cuda_memoryStats after sample (\d+): "
    r"allocator memory said allocated_bytes\.all\.current=(\d+), torch said (\d+)"
)


def printed(out: str, label: str) -> str:
    """What the script printed after `label` on the line that starts with it."""
    lines = [x for x in out.splitlines() if x.startswith(label + " ")]
    assert lines, f"no {label!r} line in:\n{out}"
    return lines[-1][len(label) + 1 :]


def printed_ints(out: str, label: str) -> list[int]:
    return [int(word) for word in printed(out, label).split()]


def shifted_notice(out: str) -> tuple[int, int, int]:
    """(sample, memory, torch) from the notice the script printed on its `notice` line."""
    found = NOTICE.search(printed(out, "notice"))
    assert found, out
    return tuple(int(g) for g in found.groups())


def test_a_mismatch_on_the_schedule_falls_back_to_the_binding_and_says_why(script):
    out = script(
        SHIFTED_BINDING.format(every=64)
        + """
lp = LineProfiler(lines)
with lp:
    until_direct(lp)
    print("before", lp.stats_reader)
    armed = True
    kept = lines(100)  # 300 line events: past several checks (one every 64 samples)
    print("after", lp.stats_reader)
    kept = lines(3)  # still profiled, through the binding
print("checks", *_core._cuda_direct_checks(0))
print("notice", _core._cuda_direct_notice(0))
rows = lp.display(lines, ["allocated_bytes.all.allocated"]).records()
print("hits", sum(r["hits"] for r in rows))
print("report", str(lp.display(lines)).count(_core._cuda_direct_notice(0)))
"""
    )
    assert printed(out, "before") == "allocator memory"
    assert printed(out, "after") == "torch._C._cuda_memoryStats"
    assert printed_ints(out, "report") == [1]  # the line report says so too
    sample, memory, torch_said = shifted_notice(out)
    assert torch_said - memory == 512
    assert 64 <= sample <= 64 * 3 + 40  # at the first scheduled check after arming
    compared, mismatched, _ = printed_ints(out, "checks")
    assert mismatched == 1
    assert compared >= 2  # the check at first use agreed, the scheduled one did not
    assert printed_ints(out, "hits")[0] >= 300  # profiling went on after the fallback


def test_a_mismatch_is_caught_at_disable(script):
    # No scheduled check can come (a million samples apart, and the clock is read only
    # every 64 samples): only disable() checks. Needs the engine to call Source::validate
    # in disable().
    out = script(
        SHIFTED_BINDING.format(every=1_000_000)
        + """
lp = LineProfiler(lines)
with lp:
    until_direct(lp)
    armed = True
    kept = lines(2)
    print("still", lp.stats_reader, _core._cuda_direct_notice(0))
print("notice", _core._cuda_direct_notice(0))
"""
    )
    assert printed(out, "still") == "allocator memory None"
    _, memory, torch_said = shifted_notice(out)
    assert torch_said - memory == 512


def test_a_mismatch_is_caught_when_another_profiler_enables(script):
    # The source is shared, so enabling a second profiler creates nothing: only the
    # engine's call to Source::validate in enable() checks.
    out = script(
        SHIFTED_BINDING.format(every=1_000_000)
        + """
first = LineProfiler(lines)
with first:
    until_direct(first)
    armed = True
    second = LineProfiler(lines)
    second.enable()
    print("first", first.stats_reader)
    print("second", second.stats_reader)
    second.disable()
print("notice", _core._cuda_direct_notice(0))
"""
    )
    assert printed(out, "first") == "torch._C._cuda_memoryStats"
    assert printed(out, "second") == "torch._C._cuda_memoryStats"
    _, memory, torch_said = shifted_notice(out)
    assert torch_said - memory == 512


TRAINING = """
import os
os.environ["MEMLAB_RS_CUDA_REVALIDATE_SAMPLES"] = "1"  # check at every sample
{setup}
import torch
from memlab_rs import LineProfiler, _core

torch.manual_seed(0)
try:
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.models.gpt2 import modeling_gpt2 as gpt2

    model = GPT2LMHeadModel(GPT2Config()).cuda()  # GPT-2 small: 124M parameters
    inner = [
        getattr(getattr(gpt2, cls), "forward")
        for cls in ("GPT2Block", "GPT2Attention", "GPT2MLP")
        if hasattr(gpt2, cls)
    ]
    vocab = model.config.vocab_size

    def loss_of(ids):
        return model(ids, labels=ids).loss

except ImportError:
    from memlab_rs.models import Block, TinyGPT

    model = TinyGPT(vocab=50257, dim=768, layers=12, heads=12, context=1024).cuda()
    inner = [Block.forward]
    vocab = 50257

    def loss_of(ids):
        logits = model(ids)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())

opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(0, vocab, (4, 128), device="cuda")
params = sum(p.numel() * p.element_size() for p in model.parameters())


def step():
    loss = loss_of(ids)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def train(steps):
    step()  # warm-up: optimizer state, and a private pool's first segments
    readers = set()
    with LineProfiler(step, *inner) as lp:
        for _ in range(steps):
            step()
            readers.add(lp.stats_reader)
    torch.cuda.synchronize()
    print("readers", sorted(readers))
    print("checks", *_core._cuda_direct_checks(0))
    print("notice", _core._cuda_direct_notice(0))
    print("peak", lp.peak_memory_stats()["allocated_bytes.all.peak"], params)
    print("why", _core._cuda_direct_why_not(0))


{run}
"""


def assert_equal_to_the_binding(out: str):
    assert printed(out, "readers") == "['allocator memory']", printed(out, "why")
    compared, mismatched, inconclusive = printed_ints(out, "checks")
    assert mismatched == 0, printed(out, "notice")
    assert compared >= 300, out  # one per line event, and at first use
    assert inconclusive <= compared // 10, out
    assert printed(out, "notice") == "None"
    peak, params = printed_ints(out, "peak")
    assert peak >= 3 * params  # weights, grads and AdamW's two moments at least


def test_direct_reader_equals_the_binding_on_gpt2_with_expandable_segments(script):
    out = script(
        TRAINING.format(
            setup='os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"',
            run="""
train(steps=3)
segments = torch.cuda.memory_snapshot()
print("expandable", any(s.get("is_expandable") for s in segments))
""",
        ),
        timeout=600,
    )
    assert printed(out, "expandable") == "True"  # the setting took: segments grow by mapping
    assert_equal_to_the_binding(out)


@pytest.mark.skipif(
    not (hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")),
    reason=f"torch {torch.__version__} has no torch.cuda.MemPool / use_mem_pool",
)
def test_direct_reader_equals_the_binding_on_gpt2_in_a_mem_pool(script):
    out = script(
        TRAINING.format(
            setup="",
            run="""
pool = torch.cuda.MemPool()
with torch.cuda.use_mem_pool(pool):
    train(steps=3)
print("pool_segments", len(pool.snapshot()))
""",
        ),
        timeout=600,
    )
    assert printed_ints(out, "pool_segments")[0] > 0  # the steps allocated in the pool
    assert_equal_to_the_binding(out)


def test_default_target_gpu_is_this_process_gpu(script):
    """Left at its default, target_gpu is this process's GPU: LOCAL_RANK (modulo the GPUs
    seen) before CUDA is initialised, the current device after; an explicit 0 is GPU 0."""
    out = script(
        """
        import os, torch, memlab_rs
        count = torch.cuda.device_count()
        last = count - 1
        os.environ["LOCAL_RANK"] = str(last)
        from_env = memlab_rs.LineProfiler().target_gpu
        os.environ["LOCAL_RANK"] = str(count + last)  # one GPU seen per rank: modulo
        wrapped = memlab_rs.LineProfiler().target_gpu
        assert not torch.cuda.is_initialized()
        torch.cuda.set_device(last)
        torch.zeros(1, device="cuda")
        os.environ["LOCAL_RANK"] = "0"
        current = memlab_rs.LineProfiler()
        explicit = memlab_rs.LineProfiler(target_gpu=0).target_gpu
        print(from_env, wrapped, current.target_gpu, current.device, explicit, last)
        """
    )
    from_env, wrapped, current, device, explicit, last = out.split()
    assert (from_env, wrapped, current, explicit) == (last, last, last, "0")
    assert device == f"cuda:{last}"


@pytest.mark.cuda
def test_the_cuda_catalogue_covers_every_key_torch_has():
    torch.zeros(1, device="cuda")
    keys = set(torch.cuda.memory_stats())
    private = {k for k in keys if k.startswith("reserved_bytes_by_private_pools.")}
    assert keys - private <= set(line_columns.catalogue("cuda:0"))
    for key in private:
        assert line_columns.check_columns([key], "cuda:0") == (key,)
