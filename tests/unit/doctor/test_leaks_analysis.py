"""The leak check's analysis (``_core.doctor.leaks_analyse``, pure Rust) over random
histories: a steady loop is never reported; a site that keeps b bytes a step is reported
with exactly b a step, whatever steady traffic shares its line; a site that rises and falls
is not; and every answer agrees with a plain model of the rule."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from memlab_rs import _core

FRAMES = [[f"/home/me/project/train_{i}.py", 10 + i, f"step_{i}"] for i in range(6)]
TORCH = ["/venv/lib/python3.12/site-packages/torch/nn/functional.py", 5, "linear"]


def analyse(warmup, steps, allocations, stacks=None):
    recording = {
        "warmup": warmup,
        "steps": steps,
        "exclude": ["-packages/torch/", "<stdlib>"],
        "cwd": "/home/me/project",
        "devices": [
            {
                "device": "cpu",
                "frames": FRAMES + [TORCH],
                # stack i: torch's frame, then the user's line i
                "stacks": stacks or [[len(FRAMES), i] for i in range(len(FRAMES))],
                "allocations": allocations,
            }
        ],
    }
    return json.loads(_core.doctor.leaks_analyse(json.dumps(recording)))["devices"][0]


def location(site):
    return f"train_{site}.py:{10 + site} (step_{site})"


def model(warmup, steps, allocations):
    """The rule, plainly: live bytes of each site at each measured step's end; a site grows
    when they rise at every measured step."""
    total = warmup + steps
    live = {}
    for stack, nbytes, made, freed in allocations:
        ends = live.setdefault(stack, [0] * total)
        for k in range(made, total if freed is None else freed):
            ends[k] += nbytes
    grown = {}
    for stack, ends in live.items():
        measured = ends[warmup:]
        if all(b > a for a, b in zip(measured, measured[1:])):
            grown[location(stack)] = (measured, (measured[-1] - measured[0]) / (steps - 1))
    return grown


def repeat(pattern, site, total, start=0):
    """``pattern`` ((bytes, lifetime in steps) pairs) made by ``site`` at every step."""
    out = []
    for step in range(start, total):
        for nbytes, lifetime in pattern:
            freed = step + lifetime
            out.append([site, nbytes, step, freed if freed < total else None])
    return out


PATTERN = st.lists(st.tuples(st.integers(1, 1 << 20), st.integers(0, 3)), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(
    patterns=st.lists(PATTERN, min_size=1, max_size=4),
    steps=st.integers(2, 8),
    extra_warmup=st.integers(0, 3),
)
def test_a_steady_loop_is_never_reported(patterns, steps, extra_warmup):
    # Warm-up at least as long as the longest lifetime: every site is at its steady level.
    warmup = max(lifetime for p in patterns for _, lifetime in p) + extra_warmup
    total = warmup + steps
    allocations = [a for site, p in enumerate(patterns) for a in repeat(p, site, total)]
    assert analyse(warmup, steps, allocations)["sites"] == []


@settings(max_examples=150, deadline=None)
@given(
    kept=st.integers(1, 1 << 30),
    steady=st.lists(st.tuples(st.integers(1, 1 << 20), st.integers(0, 2)), max_size=3),
    steps=st.integers(2, 8),
    warmup=st.integers(2, 4),
    leak_from_warmup=st.booleans(),
)
def test_a_site_keeping_b_bytes_a_step_grows_by_exactly_b(
    kept, steady, steps, warmup, leak_from_warmup
):
    total = warmup + steps
    # Site 0 keeps `kept` bytes each step and makes steady traffic on the same line;
    # site 1 only steady traffic.
    leak = repeat([(kept, total + 1)], 0, total, start=0 if leak_from_warmup else warmup)
    allocations = leak + repeat(steady, 0, total) + repeat(steady, 1, total)
    (site,) = analyse(warmup, steps, allocations)["sites"]
    assert site["location"] == location(0)
    assert site["bytes_per_step"] == kept
    assert site["allocations"] == sum(1 for a in allocations if a[0] == 0 and a[3] is None)
    diffs = [b - a for a, b in zip(site["live_bytes"], site["live_bytes"][1:])]
    assert diffs == [kept] * (steps - 1)


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 1 << 20), min_size=2, max_size=8),
    fall_at=st.integers(0, 6),
    warmup=st.integers(0, 2),
)
def test_a_site_that_rises_and_falls_is_not_reported(sizes, fall_at, warmup):
    # Each measured step keeps one more allocation, except one step that frees all and
    # makes none.
    steps = len(sizes)
    fall = warmup + 1 + fall_at % (steps - 1)
    allocations = []
    for k, nbytes in enumerate(sizes):
        made = warmup + k
        if made == fall:
            continue
        freed = fall if made < fall else None
        allocations.append([2, nbytes, made, freed])
    assert analyse(warmup, steps, allocations)["sites"] == []


ALLOCATION = st.tuples(
    st.integers(0, 5),
    st.integers(0, 1 << 40),
    st.integers(0, 9),
    st.one_of(st.none(), st.integers(0, 9)),
)


@settings(max_examples=300, deadline=None)
@given(raw=st.lists(ALLOCATION, max_size=60), warmup=st.integers(0, 3), steps=st.integers(2, 7))
def test_the_analysis_agrees_with_the_model(raw, warmup, steps):
    total = warmup + steps
    allocations = []
    for stack, nbytes, made, freed in raw:
        made %= total
        if freed is not None:
            freed = made + freed % (total - made)
        allocations.append([stack, nbytes, made, freed])
    expected = model(warmup, steps, allocations)
    got = analyse(warmup, steps, allocations)
    assert {s["location"]: (s["live_bytes"], s["bytes_per_step"]) for s in got["sites"]} == expected
    rates = [s["bytes_per_step"] for s in got["sites"]]
    assert rates == sorted(rates, reverse=True)
    outlived = sum(1 for _, _, made, freed in allocations if freed is None or freed > made)
    assert got["outlived"] == outlived


def test_the_site_is_the_innermost_frame_of_user_code_shown_from_the_working_directory():
    frames = [
        ["/venv/lib/python3.12/site-packages/torch/_tensor.py", 1, "op"],
        ["/usr/lib/python3.12/functools.py", 2, "wrapper"],
        ["<frozen importlib._bootstrap>", 3, "_call"],
        ["/home/me/project/models/net.py", 40, "forward"],
        ["/elsewhere/lib.py", 7, "run"],
    ]
    # each stack keeps 1 allocation a step: 8, 4, 2 and 1 bytes
    allocations = [[stack, nbytes, step, None] for step in (0, 1)
                   for stack, nbytes in ((0, 8), (1, 4), (2, 2), (None, 1))]  # fmt: skip
    recording = {
        "warmup": 0,
        "steps": 2,
        "exclude": ["-packages/torch/", "<stdlib>"],
        "cwd": "/home/me/project",
        "devices": [
            {
                "device": "cpu",
                "frames": frames,
                "stacks": [[0, 1, 2, 3, 4], [4], [0, 1]],
                "allocations": allocations,
            }
        ],
    }
    got = json.loads(_core.doctor.leaks_analyse(json.dumps(recording)))["devices"][0]
    assert [s["location"] for s in got["sites"]] == [
        "models/net.py:40 (forward)",
        "/elsewhere/lib.py:7 (run)",
        # every frame excluded: the innermost
        "/venv/lib/python3.12/site-packages/torch/_tensor.py:1 (op)",
        "(no Python stack)",
    ]
