"""The gc walk in fresh interpreters: the process-level tests of the gc walk (moved from
tests/unit/gc_walk/test_gc_walk.py, the walk's in-process tests).

The randomized model (tests/helpers/gc_walk_model.py) runs in fresh interpreters: on
instances of a plain class without torch (the walk itself, hundreds of sequences per Python,
each Python from its own seeds), on tensors, and with the official fallback forced, so that
each path the walk can take is checked against the model. Scripts in fresh interpreters (the
`script` fixture) check the walk where a process of its own is needed: a young generation
merged ahead of the last walk, reports from finalisers and from weakref and gc callbacks
during a collection, frozen tensors on every path, and walks from several threads.
"""

from __future__ import annotations

import os
import subprocess
import sys

from paths import TESTS

MODEL = str(TESTS / "helpers" / "gc_walk_model.py")
IN_PLACE = (
    "PyUnstable_GC_VisitObjects"
    if sys.version_info >= (3, 12)
    else "gc generation lists, since the last walk"
)


# The sequences each Python runs. CI runs this file on the oldest and newest CPython, each
# from its own seeds (the minor version is added to the seed), so together they cover twice
# as many sequences as one run. MEMLAB_RS_FUZZ_SCALE=10 runs ten times as many here, for a
# long hunt.
SCALE = float(os.environ.get("MEMLAB_RS_FUZZ_SCALE", "1"))
SEED_OFFSET = sys.version_info.minor


def sequences(count: int) -> str:
    return str(max(1, round(count * SCALE)))


def seed(base: int) -> str:
    return str(base + SEED_OFFSET)


def run_model(*args: str, env: dict | None = None, timeout: float = 900) -> str:
    proc = subprocess.run(
        [sys.executable, MODEL, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "Exception ignored" not in proc.stderr, proc.stderr[-3000:]
    return proc.stdout


def test_model_of_plain_objects_hundreds_of_sequences():
    # Allocations, drops, cycles, finalisers and weakref callbacks that walk during a
    # collection (some resurrecting), gc callbacks that walk, collections of each
    # generation, automatic collections, freeze/unfreeze; walks at random points.
    out = run_model("--kind", "node", "--sequences", sequences(800), "--seed", seed(20261122))
    assert out.startswith("OK ")
    assert IN_PLACE in out and "gc.get_objects()" in out


def test_model_of_plain_objects_resuming_as_the_tracker_does():
    # The tracker's walk: resumes from the last walk on 3.12/3.13 too. Sequences include
    # collections of generation 0 only (the sentinel moves to generation 1 and is resumed
    # from), generation 1 then freeze/unfreeze (the case a generation-2 resume would miss).
    out = run_model(
        "--kind", "node", "--sequences", sequences(400), "--seed", seed(20261122), "--resume"
    )
    assert out.startswith("OK ")
    if sys.version_info < (3, 14):
        assert "gc generation lists, since the last walk" in out


def test_model_of_tensors():
    # 12 sequences a run (each ~0.4 s of torch tensors' lifetimes); the oldest and the
    # newest CPython run different seeds, and MEMLAB_RS_FUZZ_SCALE runs more.
    out = run_model("--kind", "tensor", "--sequences", sequences(12), "--seed", seed(3))
    assert out.startswith("OK ") and IN_PLACE in out


def test_model_with_the_official_fallback_forced():
    out = run_model(
        "--kind",
        "node",
        "--sequences",
        sequences(150),
        "--seed",
        seed(5),
        env={"MEMLAB_RS_GC_WALK": "get_objects"},
    )
    assert out.startswith("OK ") and "strategies: ['gc.get_objects()']" in out


def test_issue_sequence_young_generation_merged_ahead_of_the_last_walk(script):
    # A full collection merges generation 0 ahead of a resume point that sat in
    # generation 1: the tensor made in between was missed.
    out = script(
        """
        import gc, torch
        from memlab_rs import MemReporter
        keep = [torch.randn(10) for _ in range(10)]
        MemReporter().collect()
        gc.collect(0)
        keep.append(torch.randn(10))
        walk = MemReporter(pre_collect=True).collect().to_data()["walk"]
        tracked = sum(issubclass(type(o), torch._C.TensorBase) for o in gc.get_objects())
        print(walk["tensors"], tracked)
        """
    )
    found, tracked = out.split()
    assert found == tracked


def test_reports_from_finalisers_during_collection(script):
    # Crashed with SIGSEGV before: the walk followed the collector's private lists.
    out = script(
        """
        import gc, torch
        from memlab_rs import MemReporter
        seen = []
        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(8, 8)
                self.cycle = [self]            # only the collector frees it
            def __del__(self):
                first = MemReporter(self).collect(device="cpu")
                second = MemReporter(self).collect(device="cpu")
                seen.append(([r.name for r in first.rows], first.incomplete,
                             [r.name for r in second.rows]))
        keep = torch.ones(5)
        MemReporter().collect()                # leaves a resume point behind
        for _ in range(3):
            Block()
        gc.collect()
        for names, incomplete, again in seen:
            assert names[:2] == ["lin.weight", "lin.bias"], names
            assert again[:2] == ["lin.weight", "lin.bias"], again
            assert "during a garbage collection" in incomplete, incomplete
        after = MemReporter().collect(device="cpu")
        assert after.incomplete is None
        print(len(seen))
        """
    )
    assert out.strip() == "3"


def test_weakref_callback_and_gc_callback_reports(script):
    out = script(
        """
        import gc, weakref, torch
        from memlab_rs import _core
        keep = [torch.zeros(3) for _ in range(4)]
        results = []
        def walk(*_):
            found, strategy, incomplete = _core.tracked_tensors()
            results.append((sum(any(f is k for f in found) for k in keep), strategy))
        class Holder: pass
        holder = Holder(); holder.me = holder
        holder.ref = weakref.ref(holder, walk)
        del holder
        gc.callbacks.append(lambda phase, info: walk())
        gc.collect()
        gc.callbacks.pop()
        assert results and all(n == 4 for n, _ in results), results
        print(sorted({s for _, s in results}))
        """
    )
    assert "gc.get_objects()" in out


def test_frozen_tensors_are_found_on_every_path(script):
    out = script(
        """
        import gc, os, torch
        from memlab_rs import _core
        frozen = torch.zeros(7)
        gc.freeze()
        try:
            found, strategy, incomplete = _core.tracked_tensors()
            assert any(t is frozen for t in found), strategy
            assert incomplete is None, incomplete
            os.environ["MEMLAB_RS_GC_WALK"] = "get_objects"
            found, strategy, incomplete = _core.tracked_tensors()
            assert strategy == "gc.get_objects()" and any(t is frozen for t in found)
        finally:
            gc.unfreeze()
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_walks_from_threads_agree_with_gc(script):
    out = script(
        """
        import gc, threading, torch
        from memlab_rs import _core
        errors = []
        def work(seed):
            mine = []
            for i in range(100):
                mine.append(torch.zeros(1 + (seed + i) % 5))
                if i % 7 == 0:
                    mine = mine[-20:]
                found, strategy, _ = _core.tracked_tensors()
                ids = {id(t) for t in found}
                missing = [t for t in mine if id(t) not in ids]
                if missing:
                    errors.append((seed, i, strategy, len(missing)))
                del found
        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert not errors, errors[:5]
        print("ok")
        """
    )
    assert out.strip() == "ok"
