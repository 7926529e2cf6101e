"""merge_results and diff_results: gathering over gloo and the errors that name what is
wrong. (Each kind's merge and diff is tested in its room: tests/unit/line_profiler and
tests/unit/tensor_report.)"""

from __future__ import annotations

import pytest
import torch
from made_results import reports_with

import memlab_rs
from memlab_rs import diff_results, merge_results

MiB = 1 << 20


def grow(n):
    x = torch.zeros(n, 1024)
    y = torch.ones(2 * n, 1024)
    return x.numel() + y.numel()


def profile_of(n: int) -> memlab_rs.LineProfileResult:
    with memlab_rs.LineProfiler(grow, device="cpu") as profiler:
        grow(n)
    return profiler.result()




def test_merge_errors_name_the_problem():
    profile = profile_of(64)
    with pytest.raises(ValueError, match="result 1 and result 2 are both rank 0"):
        merge_results([profile, profile])
    with pytest.raises(ValueError, match="results of one kind merge"):
        merge_results([profile, reports_with([1])], ranks=[0, 1])
    other = memlab_rs.LineProfileResult.from_data(
        profile.to_data(), {**profile.meta, "world_size": 4}
    )
    with pytest.raises(ValueError, match=r"jobs of different sizes \(world sizes \[1, 4\]\)"):
        merge_results([profile, other], ranks=[0, 1])
    with pytest.raises(ValueError, match="no results to merge"):
        merge_results([])
    with pytest.raises(ValueError, match="2 ranks given for 1 results"):
        merge_results([profile], ranks=[0, 1])
    with pytest.raises(ValueError, match="a line_profile and B a tensor_report"):
        diff_results(profile, reports_with([1]))


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
    dist.init_process_group(
        "gloo", init_method=(tmp_path / "store").as_uri(), rank=0, world_size=1
    )
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
        {**r, "min": r["max"], "median": r["max"], "max_rank": 0}
        for r in merged.records()
    ]
    assert sum(r["rank0"] for r in merged.records()) == report.total_bytes("cpu")
    del x
