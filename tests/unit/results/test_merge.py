"""merge_results and diff_results: the errors that name what is wrong. (Each kind's merge
and diff is tested in its room: tests/unit/line_profiler and tests/unit/tensor_report;
gathering over a gloo process group is in tests/integration/test_merge_gloo.py.)"""

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
