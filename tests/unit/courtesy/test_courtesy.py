"""Courtesy's bookkeeping on CPU: the whole move-and-re-point cycle run on CPU storages
(``_allow_cpu``) so views, ties, identities and every order of calls are checked without a
GPU. What needs a fresh interpreter (nothing to move in a process with no CUDA tensors, a
yield from a finaliser) is in tests/integration/test_courtesy_processes.py."""

from __future__ import annotations

import copy
import gc
import io
import os
import pickle
import signal
import threading
import weakref

import pytest
import torch

from memlab_rs import Courtesy, CourtesyRestoreError, _core
from memlab_rs.courtesy import Preemption, on_signal

MiB = 1 << 20


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
    buffer = courtesy._buffers[0]
    host = range(buffer.data_ptr(), buffer.data_ptr() + buffer.untyped_storage().nbytes())
    assert base.untyped_storage().data_ptr() in host  # re-pointed into the host buffer
    # ... onto a storage of its own there, which its views share.
    assert base.untyped_storage().nbytes() == 400
    assert window.untyped_storage()._cdata == base.untyped_storage()._cdata
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
    assert base.untyped_storage().data_ptr() not in host  # back in memory of its own


def test_yielded_tensors_save_pickle_and_copy_as_their_own():
    """While yielded, each storage is a storage of its own on its bytes of the host buffer:
    torch.save, pickle and deepcopy take those bytes alone, in the tensor's dtype (on the
    whole buffer, saving tensors of two dtypes failed and a pickle held every byte moved)."""
    big = torch.randn(MiB)  # 4 MiB moved beside the small ones
    counts = torch.arange(8)
    flags = torch.tensor([True, False, True])
    courtesy = Courtesy(_allow_cpu=True, _only=[big, counts, flags])
    assert courtesy.yield_memory().moved_storages == 3
    try:
        saved = io.BytesIO()
        torch.save({"counts": counts, "flags": flags}, saved)
        assert len(saved.getvalue()) < 4096
        saved.seek(0)
        loaded = torch.load(saved, weights_only=True)
        assert torch.equal(loaded["counts"], torch.arange(8))
        assert torch.equal(loaded["flags"], torch.tensor([True, False, True]))
        assert len(pickle.dumps(counts)) < 4096
        assert torch.equal(pickle.loads(pickle.dumps(counts)), torch.arange(8))
        clone = copy.deepcopy(counts)
        assert clone.untyped_storage().nbytes() == 8 * 8
        assert clone.data_ptr() != counts.data_ptr()
        assert counts.untyped_storage().nbytes() == 8 * 8
    finally:
        courtesy.restore()
    assert torch.equal(counts, torch.arange(8))


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
    book = _core.courtesy.HostBook()
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


def test_one_device_is_one_device_not_its_characters():
    cuda0 = torch.device("cuda:0")
    assert Courtesy("cuda:0")._devices == {cuda0}
    assert Courtesy(0)._devices == {cuda0}
    assert Courtesy(torch.device("cuda"))._devices == {cuda0}
    assert Courtesy(["cuda:0", 1])._devices == {cuda0, torch.device("cuda:1")}
    np = pytest.importorskip("numpy")
    assert Courtesy(np.int64(1))._devices == {torch.device("cuda:1")}
    with pytest.raises(TypeError, match=r"Courtesy\(devices=...\) takes a CUDA device"):
        Courtesy(1.5)
    with pytest.raises(TypeError, match=r"Courtesy\(devices=...\) takes CUDA devices"):
        Courtesy([None])
    with pytest.raises(ValueError, match="a CUDA index is 0 or more"):
        Courtesy(-1)
    with pytest.raises(ValueError, match="'gpu' is not a device"):
        Courtesy("gpu")


class StillFull(Courtesy):
    """A Courtesy whose device stays full for the first ``full_for`` restore tries: the
    one allocation restore() makes per storage fails as a full GPU's would."""

    def __init__(self, full_for: int, **kwargs):
        super().__init__(**kwargs)
        self.full_for = full_for
        self.tries = 0

    def restore(self):
        self.tries += 1
        return super().restore()

    def _allocate(self, nbytes, device):
        if self.tries <= self.full_for:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (the test's full device)")
        return super()._allocate(nbytes, device)


def test_checkpoint_retries_with_backoff_and_logs_each_try(caplog):
    x = torch.randn(256)
    copy = x.clone()
    courtesy = StillFull(2, _allow_cpu=True, _only=[x])
    with on_signal(courtesy=courtesy, retry_seconds=0.01, max_retries=5) as preemption:
        os.kill(os.getpid(), signal.SIGUSR1)
        preemption._restore.set()  # the restore signal already came
        with caplog.at_level("INFO", logger="memlab_rs.courtesy"):
            report = preemption.checkpoint(timeout=1)
    assert report is not None and courtesy.tries == 3
    assert courtesy.on_host == (0, 0) and torch.equal(x, copy)
    tries = [r.getMessage() for r in caplog.records if "restore try" in r.getMessage()]
    assert len(tries) == 2
    assert "restore try 1 of 6 failed, 1 storages (1.00K) still on the host" in tries[0]
    assert "next try in 0.0 s" in tries[0] and "the test's full device" in tries[0]
    assert any("restore succeeded on try 3" in r.getMessage() for r in caplog.records)


def test_checkpoint_gives_up_with_what_is_still_on_the_host():
    x, y = torch.randn(256), torch.randn(1000)
    copy = x.clone()
    courtesy = StillFull(100, _allow_cpu=True, _only=[x, y])
    with on_signal(courtesy=courtesy, retry_seconds=0.001, max_retries=3) as preemption:
        os.kill(os.getpid(), signal.SIGUSR1)
        preemption._restore.set()
        with pytest.raises(CourtesyRestoreError) as err:
            preemption.checkpoint(timeout=1)
    message = str(err.value)
    assert "restore failed 4 times" in message and "3 retries used up" in message
    assert "still on the host: 2 storages, 4.91K (5024 bytes)" in message
    assert err.value.report.remaining_storages == 2
    assert courtesy.tries == 4
    assert torch.equal(x, copy)  # still valid, on the host
    courtesy.full_for = 0
    courtesy.restore()  # and it can come back later
    assert courtesy.on_host == (0, 0) and torch.equal(x, copy)
    del err  # pytest.raises' ExceptionInfo and this frame hold each other


def test_checkpoint_deadline_and_bad_settings():
    x = torch.randn(16)
    courtesy = StillFull(100, _allow_cpu=True, _only=[x])
    with on_signal(
        courtesy=courtesy, retry_seconds=0.05, max_retries=1000, deadline_seconds=0.3
    ) as preemption:
        os.kill(os.getpid(), signal.SIGUSR1)
        preemption._restore.set()
        with pytest.raises(CourtesyRestoreError, match=r"the 0.3 s deadline used up"):
            preemption.checkpoint(timeout=1)
    assert 2 <= courtesy.tries <= 5  # 0.05, 0.1, then 0.2 would pass the deadline
    courtesy.full_for = 0
    courtesy.restore()
    with pytest.raises(TypeError, match="max_retries must be an int"):
        on_signal(courtesy=courtesy, max_retries=1.5)
    with pytest.raises(ValueError, match="retry_seconds must be a number of seconds"):
        on_signal(courtesy=courtesy, retry_seconds=-1)
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


def test_a_restore_that_gives_up_keeps_nothing_alive_through_cycles():
    # The errors' tracebacks must not form cycles with the frames that hold the courtesy
    # (and its pinned buffers): with gc off, dropping the error must free it all.
    gc.disable()
    try:
        x = torch.randn(64)
        courtesy = StillFull(100, _allow_cpu=True, _only=[x])
        watch = weakref.ref(courtesy)
        preemption = Preemption(courtesy, retry_seconds=0.0, max_retries=1)
        preemption._yield.set()
        preemption._restore.set()
        try:
            preemption.checkpoint(timeout=1)
        except CourtesyRestoreError:
            pass
        else:
            raise AssertionError("the restore should have given up")
        preemption.close()
        courtesy.full_for = 0
        courtesy.restore()
        del preemption, courtesy
        assert watch() is None
    finally:
        gc.enable()


def test_reports_print_their_fields():
    # Rendered in Rust from the dataclass's fields (one JSON crossing): what moved, per
    # device what stayed and why (five reasons at most), and why the walk may have missed
    # tensors; the same text the Python formatting printed before.
    from memlab_rs import RestoreReport, YieldReport

    report = YieldReport(
        moved_storages=3,
        moved_bytes=4 << 20,
        seconds=0.002,
        still_allocated={"cuda:0": 3 << 20, "cuda:1": 5},
        unmovable={"cuda:0": [(f"a sparse tensor ({i},)", 1 << 18) for i in range(7)]},
        invisible_bytes={"cuda:0": 1 << 20},
        reserved={"cuda:0": 4 << 20},
        device_used={"cuda:0": None},
        incomplete="a collection ran",
    )
    reasons = "".join(f"    256.00K: a sparse tensor ({i},)\n" for i in range(5))
    assert str(report) == (
        "Courtesy: moved 3 storages, 4.00M, to host memory in 2.0 ms (2.1 GB/s)\n"
        "  cuda:0: 3.00M still allocated: 1.00M that no Python tensor holds (saved for "
        "backward, C++ buffers), 1.75M in tensors that cannot move; 4.00M still reserved\n"
        + reasons
        + "  cuda:1: 5.00B still allocated: 0.00B that no Python tensor holds (saved for "
        "backward, C++ buffers), 0.00B in tensors that cannot move; 0.00B still reserved\n"
        "  Incomplete: a collection ran"
    )
    nothing = YieldReport(message="Courtesy: no CUDA tensors to move", incomplete="walk stopped")
    assert str(nothing) == "Courtesy: no CUDA tensors to move\n  Incomplete: walk stopped"
    restored = RestoreReport(2, 2 << 20, 0.00125, 1, 9)
    assert str(restored) == (
        "Courtesy: restored 2 storages, 2.00M, in 1.2 ms (1.7 GB/s); 1 still on the host"
    )
    assert str(RestoreReport()) == "Courtesy: nothing to restore"


def test_meta_tensors_and_fake_parameters_are_left_where_they_are():
    """A model built on the meta device, or a fake copy of one (memlab_rs.estimate makes
    them; so does torch.compile), has no bytes to move: the yield leaves them alone instead
    of failing to copy out of meta storage (it did, whenever one was alive)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with torch.device("meta"):
        meta_model = torch.nn.Linear(64, 64)
    with FakeTensorMode():
        fake = torch.nn.Parameter(torch.empty(8, 8, device="meta"))
    report = Courtesy().yield_memory()
    assert report.moved_storages == 0
    assert str(report) == "Courtesy: no CUDA tensors to move"
    # With CPU storages taken as the device's (the tests' mode), still only CPU ones move.
    cpu = torch.ones(16)
    courtesy = Courtesy(_allow_cpu=True, _only=[meta_model.weight, fake, cpu])
    assert courtesy.yield_memory().moved_storages == 1
    courtesy.restore()
    assert torch.equal(cpu, torch.ones(16)) and meta_model.weight.is_meta
