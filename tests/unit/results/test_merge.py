"""merge_results and diff_results on results made in process: exact per-rank values, the
merged line profile saved and loaded back, gathering over gloo, and the errors that name
what is wrong (tensor reports merged and compared: tests/unit/tensor_report)."""

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


def test_merged_line_profile_values_and_round_trip(tmp_path):
    merged = merge_results([profile_of(512), profile_of(256)], ranks=[1, 0])
    assert merged.ranks == [0, 1] and merged.world_size == 2
    column = "allocated_bytes.all.allocated"
    (row,) = [r for r in merged.records() if "torch.ones" in r["code"]]
    assert [row[f"{column}.{k}"] for k in ("rank0", "rank1", "min", "median", "max")] == [
        2 * MiB,
        4 * MiB,
        2 * MiB,
        3 * MiB,
        4 * MiB,
    ]
    assert row[f"{column}.max_rank"] == 1 and (row["hits.min"], row["hits.max"]) == (1, 1)
    path = tmp_path / "merged.json.gz"
    merged.save(path)
    loaded = memlab_rs.load(path)
    assert type(loaded) is memlab_rs.MergedLineProfile
    assert loaded.text() == merged.text() and loaded.records() == merged.records()
    assert (
        loaded.html() == merged.html()
        and '<th colspan="4">active_bytes.all.peak</th>' in loaded.html()
    )
    assert loaded.to_csv(columns=[column]).splitlines()[0] == (
        f"function,line,code,hits.min,hits.max,{column}.min,{column}.median,{column}.max,"
        f"{column}.max_rank,{column}.rank0,{column}.rank1"
    )
    with pytest.raises(ValueError, match="unknown column 'bogus'"):
        merged.text(columns=["bogus"])
    with pytest.raises(
        ValueError, match=r"no function 'nope' in this merged profile \(it has: grow\)"
    ):
        merged.text(func="nope")


def test_a_line_one_rank_never_ran_is_left_out_of_its_statistics():
    def branch(big):
        if big:
            z = torch.zeros(512, 1024)
            return z
        return None

    results = []
    for big in (False, True):
        with memlab_rs.LineProfiler(branch, device="cpu") as profiler:
            branch(big)
        results.append(profiler.result())
    merged = merge_results(results, ranks=[0, 1])
    (row,) = [r for r in merged.records() if "torch.zeros" in r["code"]]
    column = "allocated_bytes.all.allocated"
    assert (row[f"{column}.rank0"], row[f"{column}.rank1"]) == (None, 2 * MiB)
    assert (row[f"{column}.min"], row[f"{column}.max"], row[f"{column}.max_rank"]) == (
        2 * MiB,
        2 * MiB,
        1,
    )
    assert (row["hits.min"], row["hits.max"]) == (0, 1)  # rank 0 ran it 0 times


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


def _profile(values: dict[str, list[int]]) -> memlab_rs.LineProfileResult:
    """A line profile of known values (MiB) per line of each function, in two columns."""
    functions = [
        {
            "qualname": name,
            "filename": "train.py",
            "lines": [[i + 1, f"line {i + 1}\n", 1, [v * MiB, v * MiB]] for i, v in enumerate(vs)],
        }
        for name, vs in values.items()
    ]
    columns = ["active_bytes.all.peak", "allocated_bytes.all.allocated"]
    return memlab_rs.LineProfileResult(columns, functions, [], {"device": "cpu"})


def test_a_diff_says_the_largest_growth_of_a_line_and_of_each_functions_peak():
    """Peaks of different lines do not add: step's lines peak at 1, 3, 3, 2 MiB before and
    2, 6, 6, 4 after, so step's peak grew 3 MiB (not the 9 MiB its lines' changes add up
    to); helper's fell 1 MiB. The headline says the line that grew most and each function's
    peak, in the text and in the JSON; no figure is a sum of lines."""
    before = _profile({"step": [1, 3, 3, 2], "helper": [4, 1]})
    after = _profile({"step": [2, 6, 6, 4], "helper": [3, 1]})
    change = diff_results(before, after, columns=None)
    text = change.text().splitlines()
    assert text[2:5] == [
        "## active_bytes.all.peak: 4 lines grew (the most +3.00M at step:2), 1 shrank (the most "
        "-1.00M at helper:1)",
        "peak of step: 3.00M -> 6.00M (+3.00M)",
        "peak of helper: 4.00M -> 3.00M (-1.00M)",
    ]
    # a column that is not a peak: each function's highest line, said so
    (heading,) = [i for i, line in enumerate(text) if line.startswith("## allocated_bytes")]
    assert text[heading + 1] == "highest line of step: 3.00M -> 6.00M (+3.00M)"
    assert "9.00M" not in change.text()
    peak = change.totals[0]
    assert peak == {
        "column": "active_bytes.all.peak",
        "grew": 4,
        "shrank": 1,
        "largest_growth": {"function": "step", "line": 2, "change": 3 * MiB},
        "largest_shrink": {"function": "helper", "line": 1, "change": -MiB},
        "highest_a": 4 * MiB,
        "highest_b": 6 * MiB,
        "functions": [
            {"function": "step", "a": 3 * MiB, "b": 6 * MiB, "change": 3 * MiB},
            {"function": "helper", "a": 4 * MiB, "b": 3 * MiB, "change": -MiB},
        ],
    }
    assert change.to_data()["totals"][0] == peak
    # a function only one side ran: no peak on the other
    only = diff_results(_profile({"step": [1]}), _profile({"step": [1], "new": [2]}))
    assert only.totals[0]["functions"][1] == {"function": "new", "a": None, "b": 2 * MiB,
                                              "change": 2 * MiB}  # fmt: skip
    assert "peak of new: - -> 2.00M (+2.00M)" in only.text()
    same = diff_results(before, before).text().splitlines()
    assert same[2:5] == [
        "## active_bytes.all.peak: 0 lines grew, 0 shrank",
        "peak of step: 3.00M -> 3.00M",
        "peak of helper: 4.00M -> 4.00M",
    ]

