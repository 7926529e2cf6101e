"""Courtesy: give the GPU back for a while (preemption on a shared cluster), take it again.

``yield_memory()`` moves every CUDA storage that Python can reach (parameters, grads,
buffers, optimizer state, your own tensors) into pinned host buffers, re-points every tensor
and view on it there, and empties the CUDA cache; ``restore()`` brings each storage back
and re-points the tensors again. Storages move, not tensors, so views, tied weights and
every reference (optimizers, your variables) keep working, with the same Python objects,
strides, offsets and ``requires_grad``. Grads that are None stay None.

Call it between training steps: autograd graphs still waiting for ``backward()`` hold
tensors Python cannot see, and re-pointing a tensor such a graph saved makes that backward
fail its version check.

The storage records (where each storage sits in which pinned buffer, what is left to bring
back) live in the Rust core (``_core.courtesy.HostBook``); this module does the torch calls.
"""

from __future__ import annotations

import logging
import operator
import time
import weakref
from typing import Any

import torch

from .. import _core, _torch
from .._core import readable_size
from . import regions
from .reports import CourtesyRestoreError, RestoreReport, YieldReport

log = logging.getLogger("memlab_rs.courtesy")


def _movable(tensor: torch.Tensor) -> str | None:
    """Why ``tensor`` cannot be re-pointed, or None if it can."""
    # A Parameter's class, or a plain tensor: isinstance(t, Parameter) also holds for a
    # subclass instance made a parameter (a FakeTensor in a fake model), which is not ours.
    if not (type(tensor) is torch.Tensor or issubclass(type(tensor), torch.nn.Parameter)):
        return f"a {type(tensor).__name__} (tensor subclass)"
    if tensor.layout != torch.strided:
        return f"a {tensor.layout} tensor"
    if tensor.is_nested:
        return "a nested tensor"
    return None


def _repoint(tensor: torch.Tensor, storage: torch.UntypedStorage, offset, size, stride) -> None:
    """Make ``tensor`` (the same Python object) use ``storage`` with this geometry. A
    tensor's storage cannot change device through ``set_``; ``.data`` can, and keeps the
    object, its ``requires_grad`` and every reference to it."""
    view = torch.empty(0, dtype=tensor.dtype, device=storage.device)
    view.set_(storage, offset, size, stride)
    tensor.data = view


def _bytes_view(storage: torch.UntypedStorage) -> torch.Tensor:
    view = torch.empty(0, dtype=torch.uint8, device=storage.device)
    return view.set_(storage, 0, (storage.nbytes(),), (1,))


class Courtesy:
    """Move what the GPU holds to host memory and back, losing nothing.

    ``devices`` limits it to some GPUs: one device (an index, ``"cuda:N"`` or a
    ``torch.device``) or a list of them; all by default. Pinned host buffers are kept for
    the next yield (``release_host_memory()`` gives them back).

    >>> courtesy = Courtesy()
    >>> str(courtesy.restore())
    'Courtesy: nothing to restore'
    """

    def __init__(self, devices: Any = None, *, _allow_cpu: bool = False, _only: Any = None):
        self._devices = None if devices is None else self._device_set(devices)
        # Tests: move CPU storages through the same steps, and only those of `_only`.
        self._allow_cpu = _allow_cpu
        self._only = _only  # a list the test may change between calls
        self._book = _core.courtesy.HostBook()
        self._buffers: list[torch.Tensor] = []
        # record -> (device, [(weak tensor, offset, size, stride)])
        self._moved: dict[int, tuple[torch.device, list[tuple[Any, Any, Any, Any]]]] = {}
        self.last_yield: YieldReport | None = None
        #: seconds since the start of the last yield at the end of each phase (benchmarks)
        self.phases: dict[str, float] = {}
        self.last_restore: RestoreReport | None = None
        self._walk_note: str | None = None

    # Regions: memory a pause gives back while every address stays (courtesy/regions.py).

    region = staticmethod(regions.region)
    pause = staticmethod(regions.pause)
    resume = staticmethod(regions.resume)

    @classmethod
    def _device_set(cls, devices: Any) -> set[torch.device]:
        """``devices`` as a set: one device (``0``, ``"cuda:0"``, a ``torch.device``) or an
        iterable of them. A string is one device, never a sequence of characters."""
        if isinstance(devices, (str, torch.device)) or _is_index(devices):
            return {cls._device(devices)}
        if isinstance(devices, (bytes, dict)):  # not a list of devices (bytes: of ints)
            devices = [devices]
        try:
            items = list(devices)
        except TypeError:
            raise TypeError(
                "Courtesy(devices=...) takes a CUDA device (an index, 'cuda:N' or a "
                f"torch.device) or a list of them, got {devices!r} ({type(devices).__name__})"
            ) from None
        return {cls._device(d) for d in items}

    @staticmethod
    def _device(device: Any) -> torch.device:
        if _is_index(device):
            index = operator.index(device)
            if index < 0:
                raise ValueError(f"Courtesy(devices=...): a CUDA index is 0 or more, got {index}")
            dev = _torch.parse_device(index, "devices")
        elif isinstance(device, (str, torch.device)):
            try:
                dev = torch.device(device)
            except RuntimeError as error:
                raise ValueError(
                    f"Courtesy(devices=...): {device!r} is not a device: {error}"
                ) from None
            dev = _torch.parse_device(device, "devices")
        else:
            raise TypeError(
                "Courtesy(devices=...) takes CUDA devices (an index, 'cuda:N' or a "
                f"torch.device), got {device!r} ({type(device).__name__})"
            )
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda:0")
        if dev.type not in ("cuda", "cpu"):
            raise ValueError(f"Courtesy moves CUDA memory; {dev} is not a CUDA device")
        return dev

    def _wanted(self, device: torch.device) -> bool:
        # CUDA memory only (CPU in the tests' mode): a meta tensor (a model built on the
        # meta device, a fake tensor's storage) has no bytes to move.
        if device.type != "cuda" and not (device.type == "cpu" and self._allow_cpu):
            return False
        return self._devices is None or device in self._devices

    def __enter__(self) -> Courtesy:
        self.yield_memory()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.restore()

    def yield_memory(self) -> YieldReport:
        """Move every reachable CUDA storage to host memory; returns (and logs) a report of
        what moved and of what is still on the GPU, and why.

        >>> print(Courtesy().yield_memory())  # a process without CUDA tensors
        Courtesy: no CUDA tensors to move
        """
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        phases = self.phases = {}
        groups, unmovable = self._group()
        phases["walk and group"] = time.perf_counter() - start
        if not groups:
            self.last_yield = YieldReport(message="Courtesy: no CUDA tensors to move")
            self._fill_device_report(self.last_yield, unmovable, cuda)
            log.info("%s", self.last_yield)
            return self.last_yield
        storages = list(groups.values())
        groups.clear()
        sizes = [(s.device.index if s.is_cuda else -1, s.nbytes()) for s, _ in storages]
        buffer, allocate, placed = self._book.place(sizes)
        if allocate:
            pin = cuda and not self._allow_cpu
            self._buffers.append(torch.empty(allocate, dtype=torch.uint8, pin_memory=pin))
        host = self._buffers[buffer]
        for (storage, _), (_, offset) in zip(storages, placed):
            host[offset : offset + storage.nbytes()].copy_(_bytes_view(storage), non_blocking=True)
        phases["copies issued"] = time.perf_counter() - start
        # Re-point while the copies run: nobody reads these tensors before we synchronize,
        # and the CUDA storages stay referenced (in `storages`) until then.
        host_storage = host.untyped_storage()
        moved_bytes = 0
        with torch.no_grad():
            for (storage, owners), (record, offset) in zip(storages, placed):
                # A storage of its own on its bytes of the buffer (it keeps the buffer
                # alive), not the buffer itself: torch.save, pickle and deepcopy of a
                # yielded tensor then take its bytes alone, in its own dtype.
                own = host_storage[offset : offset + storage.nbytes()]
                entries = []
                for tensor in owners:
                    shape = (tensor.storage_offset(), tensor.size(), tensor.stride())
                    entries.append((weakref.ref(tensor), *shape))
                    _repoint(tensor, own, *shape)
                self._moved[record] = (storage.device, entries)
                moved_bytes += storage.nbytes()
        count = len(storages)
        if cuda:
            torch.cuda.synchronize()
        del storages, owners, storage
        phases["copied"] = time.perf_counter() - start
        if cuda:
            torch.cuda.empty_cache()
        phases["empty_cache"] = time.perf_counter() - start
        report = YieldReport(
            moved_storages=count, moved_bytes=moved_bytes, seconds=time.perf_counter() - start
        )
        self._fill_device_report(report, unmovable, cuda)
        self.last_yield = report
        log.info("%s", report)
        return report

    def _group(
        self,
    ) -> tuple[
        dict[int, tuple[torch.UntypedStorage, list[torch.Tensor]]],
        dict[str, list[tuple[str, int]]],
    ]:
        """The storages to move, each with the tensors on it, and what cannot move. A
        method of its own so that no loop variable keeps a CUDA storage alive after it."""
        groups: dict[int, tuple[torch.UntypedStorage, list[torch.Tensor]]] = {}
        unmovable: dict[str, list[tuple[str, int]]] = {}
        seen_unmovable: set[int] = set()
        tensors, _, self._walk_note = _core.tracked_tensors()
        if self._only is not None:
            keys = {t.untyped_storage()._cdata for t in self._only}
            tensors = [t for t in tensors if t.layout == torch.strided]
            tensors = [t for t in tensors if t.untyped_storage()._cdata in keys]
        ours = [(b.data_ptr(), b.data_ptr() + b.untyped_storage().nbytes()) for b in self._buffers]
        for tensor in tensors:
            device = tensor.device
            if not self._wanted(device):
                continue
            reason = _movable(tensor)
            if reason is not None:
                if id(tensor) not in seen_unmovable:
                    seen_unmovable.add(id(tensor))
                    described = (f"{reason} {tuple(tensor.shape)}", _storage_bytes(tensor))
                    unmovable.setdefault(str(device), []).append(described)
                continue
            storage = tensor.untyped_storage()
            if storage.nbytes() == 0 or (
                device.type == "cpu" and any(lo <= storage.data_ptr() < hi for lo, hi in ours)
            ):
                continue  # empty, or already in our host buffers (a storage on their bytes)
            groups.setdefault(storage._cdata, (storage, []))[1].append(tensor)
        return groups, unmovable

    def _fill_device_report(self, report: YieldReport, unmovable, cuda: bool) -> None:
        report.unmovable = unmovable
        report.incomplete = self._walk_note
        if not cuda:
            return
        for index in range(torch.cuda.device_count()):
            device = torch.device(f"cuda:{index}")
            if not self._wanted(device):
                continue
            name = str(device)
            allocated = torch.cuda.memory_allocated(device)
            report.still_allocated[name] = allocated
            visible = sum(b for _, b in unmovable.get(name, []))
            report.invisible_bytes[name] = max(allocated - visible, 0)
            report.reserved[name] = torch.cuda.memory_reserved(device)
            used = _core.driver_device_memory(index)
            report.device_used[name] = None if used is None else used[0]

    def restore(self) -> RestoreReport:
        """Bring every storage back to its device and re-point its tensors there.

        If the GPU is still too full, what fits comes back, the rest stays valid on the
        host, and ``CourtesyRestoreError`` says so: call ``restore()`` again later.

        >>> str(Courtesy().restore())
        'Courtesy: nothing to restore'
        """
        start = time.perf_counter()
        alive: list[tuple[int, int, int, int, int]] = []
        dead: list[tuple[int, int, int, int, int]] = []
        for record, device, nbytes, buffer, offset in self._book.pending():
            entries = self._moved[record][1]
            (alive if any(ref() is not None for ref, *_ in entries) else dead).append(
                (record, device, nbytes, buffer, offset)
            )
        self._book.gone([r[0] for r in dead])
        for record, *_ in dead:
            del self._moved[record]
        self._reserve(alive)
        targets = []
        failure = None
        for record, _, nbytes, buffer, offset in alive:
            home = self._moved[record][0]
            try:
                target = self._allocate(nbytes, home)
            except torch.cuda.OutOfMemoryError as error:
                failure = error
                break
            targets.append((record, target, buffer, offset, nbytes))
        for _, target, buffer, offset, nbytes in targets:
            target.copy_(self._buffers[buffer][offset : offset + nbytes], non_blocking=True)
        # Re-point while the copies run (nobody reads these tensors before we synchronize).
        with torch.no_grad():
            for record, target, *_ in targets:
                storage = target.untyped_storage()
                for ref, storage_offset, size, stride in self._moved.pop(record)[1]:
                    tensor = ref()
                    if tensor is not None:
                        _repoint(tensor, storage, storage_offset, size, stride)
        if any(t[1].is_cuda for t in targets):
            torch.cuda.synchronize()
        self._book.restored([t[0] for t in targets])
        remaining = self._book.on_host()
        report = RestoreReport(
            restored_storages=len(targets),
            restored_bytes=sum(t[4] for t in targets),
            seconds=time.perf_counter() - start,
            remaining_storages=remaining[0],
            remaining_bytes=remaining[1],
        )
        del targets
        self.last_restore = report
        log.info("%s", report)
        if failure is not None:
            try:
                raise CourtesyRestoreError(
                    f"restore() brought back {report.restored_storages} storages "
                    f"({readable_size(report.restored_bytes)}) but the GPU is still too full "
                    f"for the other {report.remaining_storages} "
                    f"({readable_size(report.remaining_bytes)}): {failure}. Every tensor is "
                    "still valid (those not restored live in host memory); free GPU memory "
                    "and call restore() again.",
                    report,
                ) from failure
            finally:
                # The error's traceback holds this frame: dropping the local breaks the
                # cycle, so the error does not keep `self` (and its buffers) until gc runs.
                failure = None
        return report

    @staticmethod
    def _allocate(nbytes: int, device: torch.device) -> torch.Tensor:
        """The bytes one storage comes back into (a method of its own: the tests make a
        GPU that is still full by overriding it)."""
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    @staticmethod
    def _reserve(pending) -> None:
        """Ask the caching allocator for all the bytes about to come back in one block per
        device, then free it: the storages are then carved from that cached block instead
        of one ``cudaMalloc`` each (``empty_cache()`` in the yield returned everything). If
        it does not fit, the storages are allocated one by one as far as they fit."""
        totals: dict[int, int] = {}
        for _, device, nbytes, _, _ in pending:
            if device >= 0:
                totals[device] = totals.get(device, 0) + -(-nbytes // 512) * 512
        for device, total in totals.items():
            try:
                block = torch.empty(total, dtype=torch.uint8, device=f"cuda:{device}")
            except torch.cuda.OutOfMemoryError:
                continue
            del block

    def release_host_memory(self) -> int:
        """Free the pinned host buffers nothing is waiting in; returns the bytes freed."""
        sizes = self._book.buffers()
        freed = 0
        for index in self._book.release_free():
            freed += sizes[index]
            del self._buffers[index]
        return freed

    @property
    def on_host(self) -> tuple[int, int]:
        """(storages, bytes) waiting on the host for ``restore()``."""
        return self._book.on_host()


def _is_index(value: Any) -> bool:
    """An int or integer-like value (``np.int64``), not a bool."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _storage_bytes(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return 0
