"""Saved results made on a GPU: a CUDA tensor report (the allocator's accounting), a CUDA
trace (torch's own snapshot, tuples and shared frames), the monitor and the tracker on
CUDA load back rendering byte for byte the same, with the exact bytes they recorded."""

from __future__ import annotations

import io

import pytest
import torch

import memlab_rs
from memlab_rs import results
from memlab_rs.models import TinyGPT

pytestmark = pytest.mark.cuda

MiB = 1 << 20


def round_trip(result, tmp_path, name="result.json.gz"):
    result.save(tmp_path / name)
    loaded = memlab_rs.load(tmp_path / name)
    assert type(loaded) is type(result) and loaded.meta == result.meta
    return loaded


def test_cuda_tensor_report(tmp_path):
    x = torch.empty(256, 1024, device="cuda")  # 1 MiB
    report = memlab_rs.MemReporter().collect(device="cuda:0")
    loaded = round_trip(report, tmp_path)
    assert loaded.to_text() == report.to_text()
    assert loaded._repr_html_() == report._repr_html_()
    assert loaded.to_json() == report.to_json()
    assert loaded.rows == report.rows and loaded.sections() == report.sections()
    (section,) = loaded.sections()
    assert section["allocated"] == torch.cuda.memory_allocated(0)
    assert section["reserved"] == torch.cuda.memory_reserved(0)
    assert any(r.bytes == MiB and r.shape == (256, 1024) for r in loaded.rows)
    assert loaded.meta["device"] == "cuda:0"
    del x


def test_cuda_trace(tmp_path):
    torch.manual_seed(0)
    model = TinyGPT().cuda()
    tokens = torch.zeros(4, 64, dtype=torch.long, device="cuda")
    torch.cuda.reset_peak_memory_stats()
    with memlab_rs.trace.Tracer(device="cuda", model=model, tag_modules=True) as tracer:
        model(tokens).sum().backward()
        torch.cuda.synchronize()
    result = tracer.result
    loaded = round_trip(result, tmp_path)
    for render in ("text", "module_text", "_repr_html_", "to_json", "to_csv", "timeline_html"):
        assert getattr(loaded, render)() == getattr(result, render)(), render
    assert loaded.rows() == result.rows() and loaded.summary() == result.summary()
    assert loaded.max_mem("cuda:0") == result.max_mem("cuda:0") > 0
    assert loaded.source == "cuda" and loaded.meta["device"] == "cuda:0"
    assert memlab_rs.trace.load(tmp_path / "result.json.gz").text() == result.text()


def test_cuda_monitor(tmp_path):
    torch.manual_seed(0)
    model = TinyGPT(vocab=100, dim=64, layers=2, heads=4, context=32).cuda()
    opt = torch.optim.AdamW(model.parameters())
    tokens = torch.zeros(4, 32, dtype=torch.long, device="cuda")
    with memlab_rs.memory_profiler(model, optimizer=opt, verbose=True, file=io.StringIO()) as mon:
        for _ in range(3):
            model(tokens).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            mon.record_stats()
    result = mon.result()
    loaded = round_trip(result, tmp_path)
    for step in (1, 2, 3):
        assert loaded.text(step) == result.text(step) == mon.text(step)
    assert loaded.to_csv() == result.to_csv()
    assert loaded.plot_html() == result.plot_html() and loaded.rows() == result.rows()
    assert loaded.device == "cuda:0"
    storages = {
        p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()
    }
    assert all(r["weight_usage"] == sum(storages.values()) for r in loaded.rows())


def test_cuda_tracker(tmp_path):
    tracker = memlab_rs.MemTracker(path=str(tmp_path) + "/", device=0)
    tracker.track()
    x = torch.empty(1000, device="cuda")  # 4000 bytes: one 4096-byte block
    result = tracker.track()
    loaded = results.loads(results.dumps(result))
    assert loaded.text() == result.text() and loaded._repr_html_() == result._repr_html_()
    assert loaded.allocated_bytes == result.allocated_bytes
    assert [(r.sign, r.shape, r.bytes) for r in loaded.rows if r.shape == "(1000,)"] == [
        ("+", "(1000,)", 4096)
    ]
    del x
