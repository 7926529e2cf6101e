"""gather_results over a real gloo process group (a world of one): the process-level test
of merging results (moved from tests/unit/results/test_merge.py, as it starts a
torch.distributed process group). The merged result comes back, and the exchange leaves no
tensor holding bytes behind."""

from __future__ import annotations

import torch

import memlab_rs


def storage_bytes(tensor: torch.Tensor) -> int:
    """Bytes of ``tensor``'s storage; 0 for a tensor without one (torch 2.8's gc also
    shows undefined tensors, whose storage cannot be read)."""
    try:
        return tensor.untyped_storage().nbytes()
    except NotImplementedError:
        return 0


def test_gather_results_in_a_gloo_world_of_one_leaves_no_buffer(tmp_path):
    """gather_results over a real gloo group (one rank): the merged result comes back, and
    no tensor made by the exchange still holds bytes afterwards, even one gloo's worker
    thread has not let go of yet (a report taken next must not see our buffers: with
    gather_object, a tensor report on rank 1 once showed its 22 KB uint8 buffer)."""
    import gc

    import torch.distributed as dist

    x = torch.zeros(256, 1024)
    report = memlab_rs.MemReporter().collect(device="cpu")
    before = {id(o) for o in gc.get_objects() if issubclass(type(o), torch.Tensor)}
    dist.init_process_group("gloo", init_method=(tmp_path / "store").as_uri(), rank=0, world_size=1)
    try:
        # 40 times: with gather_object an eighth of the calls left its buffer visible
        left = []
        for _ in range(40):
            merged = memlab_rs.gather_results(report)
            left += [
                o
                for o in gc.get_objects()
                if issubclass(type(o), torch.Tensor)
                and id(o) not in before
                and storage_bytes(o) > 0
            ]
    finally:
        dist.destroy_process_group()
    assert left == []
    assert merged.kind == "merged_tensor_report" and merged.ranks == [0]
    assert merged.records() == [
        {**r, "min": r["max"], "median": r["max"], "max_rank": 0} for r in merged.records()
    ]
    assert sum(r["rank0"] for r in merged.records()) == report.total_bytes("cpu")
    del x
