"""Yield the GPU when a signal asks for it (``on_signal``, ``Preemption``): the signal
handlers only set flags, and ``checkpoint()``, called between training steps, yields,
waits for the restore signal and restores, trying again while the GPU is still too full."""

from __future__ import annotations

import operator
import signal
import threading
import time
from typing import Any

from .. import _args
from .._core import readable_size
from .moves import Courtesy, _is_index, log
from .reports import CourtesyRestoreError, YieldReport


class Preemption:
    """Yield the GPU when a signal asks for it, at a safe point of your loop.

    Signal handlers only set flags; ``checkpoint()``, called between training steps, does
    the work: when the yield signal came, it moves the GPU state to host memory, waits for
    the restore signal, brings everything back and returns the yield's report. Otherwise
    it returns None at once.

    A restore that finds the GPU still too full is tried again after ``retry_seconds``,
    the wait doubling each time up to ``max_retry_seconds``, at most ``max_retries``
    times and, when ``deadline_seconds`` is set, no later than that many seconds after the
    first try. Each failed try is logged (``memlab_rs.courtesy`` logger, WARNING); when
    none is left, ``checkpoint()`` raises ``CourtesyRestoreError`` saying what is still on
    the host. Every tensor stays valid: ``courtesy.restore()`` may be called again later.
    The defaults (5 s doubling to 60 s, 12 retries) give up after about 9 minutes.

        preemption = memlab_rs.courtesy.on_signal()      # SIGUSR1 yields, SIGUSR2 restores
        for batch in loader:
            train_step(batch)
            preemption.checkpoint()
    """

    def __init__(
        self,
        courtesy: Courtesy | None = None,
        yield_signal: int = signal.SIGUSR1,
        restore_signal: int = signal.SIGUSR2,
        retry_seconds: float = 5.0,
        *,
        max_retries: int = 12,
        max_retry_seconds: float = 60.0,
        deadline_seconds: float | None = None,
    ):
        self.courtesy = courtesy or Courtesy()
        self.retry_seconds = _seconds(retry_seconds, "retry_seconds")
        self.max_retry_seconds = _seconds(max_retry_seconds, "max_retry_seconds")
        if not _is_index(max_retries):
            raise TypeError(f"max_retries must be an int >= 0, got {max_retries!r}")
        self.max_retries = operator.index(max_retries)
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        self.deadline_seconds = (
            None if deadline_seconds is None else _seconds(deadline_seconds, "deadline_seconds")
        )
        self._yield = threading.Event()
        self._restore = threading.Event()
        self._signals = (yield_signal, restore_signal)
        self._previous = {
            yield_signal: signal.signal(yield_signal, lambda *_: self._yield.set()),
            restore_signal: signal.signal(restore_signal, lambda *_: self._restore.set()),
        }

    def checkpoint(self, timeout: float | None = None) -> YieldReport | None:
        """Yield, wait for the restore signal (at most ``timeout`` seconds) and restore, if
        a yield was asked for; else return None at once. Raises ``CourtesyRestoreError``
        when the restore still fails after the retries (see the class)."""
        if not self._yield.is_set():
            return None
        self._yield.clear()
        report = self.courtesy.yield_memory()
        self._restore.wait(timeout)
        self._restore.clear()
        self._restore_with_retries()
        return report

    def _restore_with_retries(self) -> None:
        start = time.monotonic()
        delay = self.retry_seconds
        tries = 0
        while True:
            tries += 1
            failure = self._try_restore()
            if failure is None:
                if tries > 1:
                    log.info("Courtesy: restore succeeded on try %d", tries)
                return
            storages, nbytes = self.courtesy.on_host
            elapsed = time.monotonic() - start
            out_of_tries = tries > self.max_retries
            past_deadline = (
                self.deadline_seconds is not None and elapsed + delay > self.deadline_seconds
            )
            if out_of_tries or past_deadline:
                why = (
                    f"{self.max_retries} retries"
                    if out_of_tries
                    else f"the {self.deadline_seconds:g} s deadline"
                )
                try:
                    raise CourtesyRestoreError(
                        f"Preemption.checkpoint(): restore failed {tries} times in "
                        f"{elapsed:.1f} s ({why} used up); still on the host: {storages} "
                        f"storages, {readable_size(nbytes)} ({nbytes} bytes). Every tensor is "
                        "still valid (those not restored live in host memory); free GPU memory "
                        f"and call restore() again. Last error: {failure}",
                        failure.report,
                    ) from failure
                finally:
                    failure = None  # no cycle through this frame (see restore())
            log.warning(
                "Courtesy: restore try %d of %d failed, %d storages (%s) still on the host; "
                "next try in %.1f s: %s",
                tries,
                self.max_retries + 1,
                storages,
                readable_size(nbytes),
                delay,
                str(failure),  # a string: a kept log record must not keep the traceback
            )
            failure = None
            time.sleep(delay)
            delay = min(delay * 2, self.max_retry_seconds)

    def _try_restore(self) -> CourtesyRestoreError | None:
        """``restore()``, its error returned rather than raised."""
        try:
            self.courtesy.restore()
        except CourtesyRestoreError as error:
            return error
        return None

    def close(self) -> None:
        """Put back the signal handlers that were there before."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def __enter__(self) -> Preemption:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _seconds(value: Any, name: str) -> float:
    """A finite number of seconds >= 0 (an infinite wait would be an OverflowError in
    ``time.sleep`` much later, far from the argument that caused it)."""
    return _args.number(value, name, maximum=threading.TIMEOUT_MAX, what="a number of seconds")


def on_signal(
    yield_signal: int = signal.SIGUSR1,
    restore_signal: int = signal.SIGUSR2,
    courtesy: Courtesy | None = None,
    **retries: Any,
) -> Preemption:
    """Install handlers: ``yield_signal`` asks to give the GPU back at the next
    ``checkpoint()``, ``restore_signal`` to take it again (see ``Preemption``, whose
    ``retry_seconds``, ``max_retries``, ``max_retry_seconds`` and ``deadline_seconds``
    ``retries`` may set).

    >>> with on_signal() as preemption:
    ...     preemption.checkpoint() is None
    True
    """
    return Preemption(courtesy, yield_signal, restore_signal, **retries)
