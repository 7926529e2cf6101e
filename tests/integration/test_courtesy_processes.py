"""Courtesy in a fresh interpreter (the `script` fixture): the process-level tests of
Courtesy (moved from tests/unit/courtesy/test_courtesy.py). A process whose tensors are all
on the CPU has nothing to move and says so, and a yield from a finaliser during a collection
says what its walk cannot see."""

from __future__ import annotations


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


def test_a_yield_from_a_finaliser_says_what_it_cannot_see(script):
    # During a collection the walk reads only gc.get_objects(): the report must say so.
    out = script(
        """
        import gc
        from memlab_rs import Courtesy
        notes = []
        class Holder:
            def __init__(self):
                self.me = self
            def __del__(self):
                notes.append(str(Courtesy().yield_memory()))
        Holder()
        gc.collect()
        print(notes[0])
        """
    )
    assert "no CUDA tensors to move" in out
    assert "Incomplete: the report was made during a garbage collection" in out
