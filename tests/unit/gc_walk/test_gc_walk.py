"""The gc walk on its own, in the test process: exact in every gc state, safe inside
collections (a removed gc callback put back, the collection depth balanced, non-types
rejected, no note on the usual path).

What needs a fresh interpreter (the randomized model of tests/helpers/gc_walk_model.py, and
scripts run with the `script` fixture) is in tests/integration/test_gc_walk_processes.py.
"""

from __future__ import annotations

import gc

import pytest
import torch

from memlab_rs import MemReporter, _core


def test_a_removed_gc_callback_is_put_back_and_the_walk_stays_exact():
    keep = [torch.zeros(2) for _ in range(3)]
    saved = list(gc.callbacks)
    gc.callbacks.clear()
    try:
        found, strategy, _ = _core.tracked_tensors()
        assert strategy == "gc.get_objects()"  # could not tell what happened meanwhile
        assert all(any(f is k for f in found) for k in keep)
        assert any(getattr(c, "__name__", "") == "_gc_callback" for c in gc.callbacks)
        _, strategy, _ = _core.tracked_tensors()
        assert strategy != "gc.get_objects()"
    finally:
        ours = [c for c in gc.callbacks if getattr(c, "__name__", "") == "_gc_callback"]
        gc.callbacks[:] = saved + [c for c in ours if c not in saved]
    assert sum(getattr(c, "__name__", "") == "_gc_callback" for c in gc.callbacks) == 1


def test_collection_depth_is_counted_and_balanced():
    gc.collect()
    depth, _, _ = _core._gc_watch_state()
    assert depth == 0
    seen = []
    gc.callbacks.append(lambda phase, info: seen.append((phase, _core._gc_watch_state()[0])))
    try:
        gc.collect(1)
    finally:
        gc.callbacks.pop()
    # Ours was registered first: at start it already counts the collection, at stop it
    # already took it back.
    assert seen == [("start", 1), ("stop", 0)]


def test_instances_of_rejects_non_types():
    with pytest.raises(TypeError):
        _core._instances_of("not a type")


def test_report_carries_no_note_on_the_usual_path():
    report = MemReporter().collect()
    assert report.incomplete is None
    assert "Incomplete" not in str(MemReporter().collect())
