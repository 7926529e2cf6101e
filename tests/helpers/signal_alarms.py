"""SIGALRM timeouts fired into a call, as a program guarding a step with a timeout does: each
handler call raises, and every one of them must reach the caller.

``alarms_into(call, delays)`` runs ``call()`` once per delay with a one-shot timer of that
many seconds and returns (handler calls that raised, exceptions the caller saw); ``raises``
is what the handler raises (``Alarm``, or ``KeyboardInterrupt`` as Ctrl-C). The handler
raises only while the call's ``try`` is armed, so a timer that expires after the call
(caught there too) is counted on both sides, and none leaks into the test itself.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable
from typing import Any


class Alarm(Exception):
    """What the handler raises (a timeout, in a real program)."""


def alarms_into(
    call: Callable[[], Any], delays: Iterable[float], raises: type[BaseException] = Alarm
) -> tuple[int, int]:
    raised = seen = 0
    armed = False

    def on_alarm(signum, frame):
        nonlocal raised
        if armed:
            raised += 1
            raise raises(f"timed out (signal {signum})")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        for delay in delays:
            try:
                armed = True
                signal.setitimer(signal.ITIMER_REAL, delay)
                call()
                signal.setitimer(signal.ITIMER_REAL, 0)
                armed = False
            except raises:
                armed = False
                seen += 1
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return raised, seen


def spread(seconds: float, n: int) -> list[float]:
    """``n`` delays spread over ``seconds`` (the length of the call), none of them 0."""
    return [seconds * (i + 0.5) / n for i in range(n)]
