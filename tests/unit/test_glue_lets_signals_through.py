"""Python glue that takes a failed read for "unknown" (``except Exception``) must let a
signal handler's exception through: a SIGALRM timeout raised while ``track()`` was inside
``rank_info``'s ``try`` was swallowed there, and the caller's timeout was lost (the
tracker's alarm test failed about once in ten suites). Here the signal is sent at each
line inside each such ``try``, deterministically: a trace function sends it, and the
handler runs at the next bytecode, inside the ``try``."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

from memlab_rs.doctor import facts
from memlab_rs.results import meta
from memlab_rs.trace import names
from tests.helpers.signal_alarms import Alarm


def _lines_inside_try(function: Callable[..., Any]) -> list[int]:
    """The line numbers of the statements inside ``function``'s ``try`` blocks."""
    import ast
    import inspect
    import textwrap

    source, first = inspect.getsourcelines(function)
    tree = ast.parse(textwrap.dedent("".join(source)))
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            for statement in node.body:
                lines.add(statement.lineno + first - 1)
    return sorted(lines)


def _alarm_at(function: Callable[..., Any], line: int, call: Callable[[], Any]) -> None:
    """Run ``call()`` with SIGALRM sent to this process when ``function`` reaches ``line``
    (its handler raises Alarm at the next bytecode)."""
    code = function.__code__

    def trace(frame, event, arg):
        if frame.f_code is not code:
            return None
        if event == "line" and frame.f_lineno == line:
            os.kill(os.getpid(), signal.SIGALRM)
        return trace

    def on_alarm(signum, frame):
        raise Alarm("timed out")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(None)
        signal.signal(signal.SIGALRM, previous)


_CASES: list[tuple[str, Callable[..., Any], Callable[[], Any]]] = [
    ("rank_info", meta.rank_info, meta.rank_info),
    ("names._address", names._address, lambda: names._address(torch.zeros(2), ("cpu", None))),
    ("names._grad", names._grad, lambda: names._grad(torch.zeros(2, requires_grad=True))),
    ("facts._storage_key", facts._storage_key, lambda: facts._storage_key(torch.zeros(2))),
]


@pytest.mark.parametrize("function,call", [c[1:] for c in _CASES], ids=[c[0] for c in _CASES])
def test_a_signal_handlers_exception_inside_a_guarded_read_reaches_the_caller(function, call):
    lines = _lines_inside_try(function)
    assert lines, "the function has no try block any more: update the case list"
    for line in lines:
        with pytest.raises(Alarm):
            _alarm_at(function, line, call)


def test_the_reads_own_failures_still_count_as_unknown():
    # A tensor without storage of its own (meta has one, a wrapper subclass has none): the
    # guarded read answers "unknown" instead of raising.
    class Broken:
        @property
        def device(self):
            raise RuntimeError("no device")

    assert names._address(torch.zeros(2, device="meta"), ("cpu", None)) == 0
    assert facts._storage_key(Broken()) is None  # type: ignore[arg-type]
    assert meta.rank_info()["world_size"] >= 1
