"""Courtesy's bookkeeping on CPU: nothing to move, and the whole move-and-re-point cycle
run on CPU storages (``_allow_cpu``) so views, ties, identities and every order of calls
are checked without a GPU."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch

from memlab_rs import Courtesy, _core
from memlab_rs.courtesy import on_signal


def test_nothing_to_move_says_so(script):
    out = script(
        """
        import torch
        from memlab_rs import Courtesy
        model = torch.nn.Linear(8, 8)  # CPU tensors only: nothing a GPU holds
        courtesy = Courtesy()
        report = courtesy.yield_memory()
        print(report.moved_storages, report.moved_bytes)
        print(report)
        print(courtesy.restore())
        print(courtesy.on_host, model.weight.device)
        """
    )
    assert out.splitlines() == [
        "0 0",
        "Courtesy: no CUDA tensors to move",
        "Courtesy: nothing to restore",
        "(0, 0) cpu",
    ]


def make_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.Linear(16, 32))
    model[1].weight = torch.nn.Parameter(model[0].weight.t())  # a transposed tie (a view)
    frozen = torch.nn.Parameter(torch.randn(8))  # never gets a grad
    optimizer = torch.optim.AdamW(list(model.parameters()) + [frozen])
    model(torch.randn(4, 32)).sum().backward()
    optimizer.step()
    return model, frozen, optimizer


def snapshot(tensors):
    return [t.detach().clone() for t in tensors]


def test_round_trip_keeps_values_identity_views_and_ties():
    model, frozen, optimizer = make_state()
    base = torch.arange(100.0)
    window = base[10:30].view(4, 5)
    tensors = [*model.parameters(), frozen, base, window]
    grads = [p.grad for p in model.parameters()]
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    before = snapshot(tensors + grads + state)
    ids = [id(t) for t in tensors]
    keys = [id(k) for k in optimizer.state]
    courtesy = Courtesy(_allow_cpu=True, _only=tensors + grads + state)
    report = courtesy.yield_memory()
    assert report.moved_storages >= 10
    host = courtesy._buffers[0].untyped_storage()._cdata
    assert base.untyped_storage()._cdata == host  # re-pointed into the host buffer
    assert courtesy.on_host[0] == report.moved_storages
    courtesy.restore()
    assert courtesy.on_host == (0, 0)
    after = tensors + grads + state
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert [id(t) for t in tensors] == ids
    assert frozen.grad is None and frozen.requires_grad
    assert isinstance(model[0].weight, torch.nn.Parameter)
    assert window.untyped_storage()._cdata == base.untyped_storage()._cdata
    assert window.storage_offset() == 10 and window.stride() == (5, 1)
    tie = model[1].weight
    assert tie.untyped_storage()._cdata == model[0].weight.untyped_storage()._cdata
    assert tie.stride() == (1, 32)
    assert [id(k) for k in optimizer.state] == keys
    assert base.untyped_storage()._cdata != host  # each storage has its own again


def test_yield_twice_restore_twice_restore_without_yield():
    first = torch.randn(1000)
    kept = first.clone()
    only = [first]
    courtesy = Courtesy(_allow_cpu=True, _only=only)
    assert courtesy.restore().restored_storages == 0  # restore without yield
    assert courtesy.yield_memory().moved_storages >= 1
    second = torch.randn(500)  # made while yielded
    copy_second = second.clone()
    only.append(second)
    again = courtesy.yield_memory()  # yield twice: the new storage moves, the old stays put
    assert again.moved_storages >= 1
    assert len(courtesy._buffers) == 2
    report = courtesy.restore()
    assert report.remaining_storages == 0
    assert torch.equal(first, kept) and torch.equal(second, copy_second)
    assert courtesy.restore().restored_storages == 0  # restore twice
    assert courtesy.release_host_memory() > 0 and courtesy._buffers == []


def test_the_next_yield_reuses_the_host_buffer():
    state = [torch.randn(1000) for _ in range(10)]
    courtesy = Courtesy(_allow_cpu=True, _only=state)
    for _ in range(3):
        courtesy.yield_memory()
        courtesy.restore()
    assert len(courtesy._buffers) == 1 and len(state) == 10


def test_tensors_that_died_on_the_host_are_not_brought_back():
    doomed, kept = torch.randn(10_000), torch.randn(100)
    only = [doomed, kept]
    courtesy = Courtesy(_allow_cpu=True, _only=only)
    courtesy.yield_memory()
    pending = courtesy.on_host[0]
    only.remove(doomed)
    del doomed
    report = courtesy.restore()
    assert report.restored_storages < pending


def test_context_manager_and_bad_devices():
    x = torch.randn(64)
    copy = x.clone()
    with Courtesy(_allow_cpu=True, _only=[x]) as courtesy:
        assert courtesy.on_host[1] > 0
    assert torch.equal(x, copy) and courtesy.on_host == (0, 0)
    with pytest.raises(ValueError, match="not a CUDA device"):
        Courtesy(devices=["meta"])


def test_host_book_places_and_reuses_buffers():
    book = _core.HostBook()
    buffer, allocate, placed = book.place([(0, 1000), (1, 10)])
    assert (buffer, allocate, placed) == (0, 1 << 20, [(0, 0), (1, 1024)])
    book.restored([0, 1])
    assert book.place([(0, 1500)])[:2] == (0, 0)


def test_signals_yield_at_the_checkpoint_and_restore():
    x = torch.randn(256)
    copy = x.clone()
    courtesy = Courtesy(_allow_cpu=True, _only=[x])
    with on_signal(courtesy=courtesy) as preemption:
        assert preemption.checkpoint() is None  # no signal: returns at once
        os.kill(os.getpid(), signal.SIGUSR1)
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR2)).start()
        report = preemption.checkpoint(timeout=10)
    assert report is not None and report.moved_storages >= 1
    assert courtesy.on_host == (0, 0) and torch.equal(x, copy)
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
