"""A KeyboardInterrupt at every line a tool's own modules run, in turn: where a real Ctrl-C
can land (between any two statements). ``lines_to_try(run, modules, on)`` runs
``run(tracer)`` (twice: the first run has one-off lines) to count those lines and says which
to interrupt at: every line within 8 of where ``on()`` (is the tool's recording on?)
changes, and every ``stride``-th elsewhere (each try starts the tool again, and a start can
cost a walk of the heap). ``interrupt_at_each_line`` tries them all."""

from __future__ import annotations

import linecache
from collections.abc import Callable
from typing import Any


class InterruptAtLine:
    """A trace function (``sys.settrace``) raising KeyboardInterrupt before the ``at``-th
    line run in a file whose name ends with one of ``modules`` (``at`` past the last line:
    no interrupt; ``seen`` counts the lines and ``states`` what ``on()`` said before each)."""

    def __init__(self, at: int, modules: tuple[str, ...], on: Callable[[], bool]):
        self.at = at
        self.modules = modules
        self.on = on
        self.seen = 0
        self.states: list[bool] = []
        self._with_lines: set[tuple[int, int]] = set()

    def _with_exit(self, frame: Any) -> bool:
        """Whether this line event is a ``with`` block's exit: CPython reports the ``with``
        line again before calling ``__exit__``, at an instruction outside the block's
        protection where no signal is ever handled (no eval-breaker check), so an
        exception raised there would skip ``__exit__``, which a real Ctrl-C cannot do."""
        text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).lstrip()
        if not text.startswith(("with ", "async with ")):
            return False
        key = (id(frame), frame.f_lineno)
        if key in self._with_lines:
            return True
        self._with_lines.add(key)
        return False

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if not frame.f_code.co_filename.endswith(self.modules):
            return None
        if event == "line" and not self._with_exit(frame):
            self.seen += 1
            if self.seen == self.at:
                raise KeyboardInterrupt
            self.states.append(self.on())
        return self


def lines_to_try(
    run: Callable[[InterruptAtLine], None],
    modules: tuple[str, ...],
    on: Callable[[], bool],
    stride: int = 15,
) -> list[int]:
    run(InterruptAtLine(0, modules, on))  # a first run's one-off lines (lazy imports) aside
    counting = InterruptAtLine(0, modules, on)
    run(counting)
    states = counting.states
    assert counting.seen > 20 and any(states) and not states[0] and not states[-1], states
    turns = [i for i in range(1, len(states)) if states[i] != states[i - 1]]
    return [
        at
        for at in range(1, counting.seen + 1)
        if at % stride == 0 or any(abs(at - 1 - turn) <= 8 for turn in turns)
    ]


def interrupt_at_each_line(
    run: Callable[[InterruptAtLine], None],
    modules: tuple[str, ...],
    on: Callable[[], bool],
    check: Callable[[], None],
    stride: int = 15,
) -> int:
    """Run ``run`` interrupted at each line of ``lines_to_try`` and ``check()`` after each
    (nothing of the tool left on). A run may take a few lines fewer than the one counted
    (its recording holds what the allocator did, which varies): one that ends before its
    line is checked all the same. Returns how many runs were interrupted."""
    lines = lines_to_try(run, modules, on, stride)
    interrupted = 0
    for at in lines:
        tracer = InterruptAtLine(at, modules, on)
        try:
            run(tracer)
        except KeyboardInterrupt:
            interrupted += 1
        else:
            assert tracer.seen < at, (at, tracer.seen)
        check()
    assert interrupted >= len(lines) - 3, (interrupted, len(lines))
    return interrupted
