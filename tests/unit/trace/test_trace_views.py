"""Every view of a trace's module grouping reads one assignment of the live set at the peak:
the module rows, their text, CSV, JSON, HTML and data frame, the keyword groups and the
untagged log agree, on generated histories checked against a plain model and on real steps
recorded on the CPU (on CUDA: tests/gpu/test_trace_cuda.py)."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from paths import FIXTURES
from trace_views import PHASES, assert_views_agree, nbytes

from memlab_rs import trace

TORCH = "/env/lib/python3.12/site-packages/torch"
USER = {"filename": "/app/train.py", "line": 11, "name": "step"}
CALL = {"filename": f"{TORCH}/nn/modules/module.py", "line": 1750, "name": "_call_impl"}
# Stacks (innermost first) and the tag their frames give (Locator::frame_tags).
STACKS = [
    ([], ""),
    ([USER], ""),
    (
        [
            {"filename": f"{TORCH}/autograd/__init__.py", "line": 200, "name": "backward"},
            {"filename": f"{TORCH}/_tensor.py", "line": 500, "name": "backward"},
            USER,
        ],
        "backward:",
    ),
    (
        [{"filename": "/app/model.py", "line": 30, "name": "forward"}, CALL, USER],
        "forward:[model.py:30 (forward)]",
    ),
    (
        [{"filename": f"{TORCH}/nn/modules/linear.py", "line": 125, "name": "forward"}, CALL, USER],
        "forward:",
    ),
    (
        [{"filename": f"{TORCH}/optim/adam.py", "line": 400, "name": "_single_tensor_adam"}, USER],
        "optimizer:",
    ),
]
TAGS = ["", "forward:", "forward:0", "backward:", "backward:lm_head", "optimizer:Adam", "step0"]


def shown(tag):
    """A tag as the module view shows it: a phase with no module says so."""
    return f"{tag}(no module)" if tag in PHASES else tag


def expected_key(tag, stack):
    """The module row of an allocation made while recording, under `tag` by `stack`."""
    if tag:
        return shown(tag)
    if STACKS[stack][1]:
        return shown(STACKS[stack][1])
    return "(untagged)"


def history(start, steps):
    """A CPU snapshot from `start` ((size, named?) alive before recording) and `steps`
    ((free?, size, tag, stack) each), and the plain model's module rows at the peak."""
    live = {}
    key_of = {}
    names = []
    for i, (size, named) in enumerate(start):
        addr = 0x1000 * (i + 1)
        live[addr] = size
        key_of[addr] = f"untraced:p{i}.weight" if named else "untraced"
        if named:
            names.append([addr, f"p{i}.weight"])
    start_live = [[a, s] for a, s in live.items()]
    entries, next_addr, t = [], 0x100000, 1_000
    current = best = sum(live.values())
    best_live = dict(live)
    for free, size, tag, stack in steps:
        t += 1
        if free and live:
            addr = sorted(live)[size % len(live)]
            gone = live.pop(addr)
            for action in ("free_requested", "free_completed"):
                entries.append(
                    {
                        "action": action,
                        "addr": addr,
                        "size": gone,
                        "stream": 0,
                        "time_us": t,
                        "frames": [],
                        "user_metadata": "",
                    }
                )
            current -= gone
            continue
        addr, next_addr = next_addr, next_addr + size + 64
        live[addr] = size
        key_of[addr] = expected_key(TAGS[tag], stack)
        entries.append(
            {
                "action": "alloc",
                "addr": addr,
                "size": size,
                "stream": 0,
                "time_us": t,
                "frames": STACKS[stack][0],
                "user_metadata": TAGS[tag],
            }
        )
        current += size
        if current > best:
            best, best_live = current, dict(live)
    snapshot = {
        "segments": [],
        "device_traces": [entries],
        "memlab_rs": {
            "version": 1,
            "source": "cpu",
            "start": {"time_us": 0, "live": start_live, "names": names},
        },
    }
    rows = {}
    for addr, size in best_live.items():
        rows.setdefault(key_of[addr], []).append(size)
    return snapshot, {k: (sum(v), len(v), sorted(v)[len(v) // 2]) for k, v in rows.items()}


step = st.tuples(
    st.booleans(),
    st.sampled_from([16, 512, 4099, 65536, 1 << 20]),
    st.integers(0, len(TAGS) - 1),
    st.integers(0, len(STACKS) - 1),
)


@settings(max_examples=80, deadline=None)
@given(
    start=st.lists(st.tuples(st.sampled_from([64, 4096, 1 << 20]), st.booleans()), max_size=4),
    steps=st.lists(step, max_size=60),
)
def test_generated_histories_every_module_view_reads_one_grouping(start, steps):
    snapshot, expected = history(start, steps)
    result = trace.load(snapshot)
    if not result.devices:
        return
    rows = {r.location: (r.bytes, r.count, r.median) for r in result.module_rows("cpu")}
    assert rows == expected
    assert_views_agree(result)


def test_a_cpu_step_with_module_tags_every_view_agrees():
    """The report of issue 20: after a tagged step, untagged_log listed 7.32 MiB in 5
    allocations while the (untagged) row had 2.44 MiB and 4.88 MiB sat under `backward:`."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
    )
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(512, 256)

    def train_step():
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    train_step()
    with trace.Tracer(device="cpu", model=model, tag_modules=True) as tr:
        train_step()
    result = tr.result
    keys = [r.location for r in result.module_rows("cpu")]
    # The loss's gradient is made under Tensor.backward before any module's backward.
    assert "backward:(no module)" in keys
    assert_views_agree(result)


# -- what was alive at the start, by tensor -------------------------------------------------
class Probe(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(128, 512)  # weight 256 KiB, bias 2 KiB
        self.register_buffer("scale", torch.ones(300))

    def forward(self, x):
        return self.lin(x) * self.scale[:1]


def trained_probe():
    torch.manual_seed(0)
    model = Probe()
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(64, 128)

    def train_step():
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=False)  # the gradients stay: alive at the next start

    train_step()
    return model, opt, train_step


def test_what_was_alive_at_the_start_is_named_by_tensor_in_the_module_view():
    model, opt, train_step = trained_probe()
    with trace.Tracer(device="cpu", model=model) as tr:
        train_step()
    result = tr.result
    rows = {r.location: r for r in result.module_rows("cpu")}
    w = model.lin.weight
    expected = {
        "untraced:lin.weight": nbytes(w),
        "untraced:lin.weight.grad": nbytes(w.grad),
        "untraced:lin.bias": nbytes(model.lin.bias),
        "untraced:scale": nbytes(model.scale),
        "untraced:Adam.lin.weight.exp_avg": nbytes(opt.state[w]["exp_avg"]),
        "untraced:Adam.lin.weight.exp_avg_sq": nbytes(opt.state[w]["exp_avg_sq"]),
    }
    assert {k: rows[k].bytes for k in expected} == expected
    assert all(rows[k].count == 1 for k in expected)
    # Every untraced row together is what was alive at the start and still at the peak.
    untraced = [r for r in result.module_rows("cpu") if r.location.split(":")[0] == "untraced"]
    (location_row,) = [r for r in result.rows("cpu") if r.location == "untraced"]
    assert sum(r.bytes for r in untraced) == location_row.bytes
    # The tagging profiler's keyword groups find the weights now.
    groups = dict(result.keywords({"grads": ["grad"], "weights": ["weight"]}, None))
    grads = sum(r.bytes for r in untraced if "grad" in r.location)
    weights = sum(r.bytes for r in untraced if "weight" in r.location) - nbytes(w.grad)
    assert groups["grads"] == grads == nbytes(w.grad) + nbytes(model.lin.bias.grad)
    assert groups["weights"] == weights >= 3 * nbytes(w)  # the weight, exp_avg, exp_avg_sq
    assert_views_agree(result)


def test_without_a_model_the_tracer_finds_it():
    model, opt, train_step = trained_probe()
    with trace.Tracer(device="cpu") as tr:
        train_step()
    rows = {r.location: r.bytes for r in tr.result.module_rows("cpu")}
    # Named as a model passed in would be, or after its class when other models are alive
    # (other tests' modules in this process): "Probe.lin.weight", "Probe[2].lin.weight".
    w = model.lin.weight
    root = r"(Probe(\[\d+\])?\.)?"
    for pattern, tensor in [
        (rf"untraced:{root}lin\.weight", w),
        (rf"untraced:{root}lin\.weight\.grad", w.grad),
        (rf"untraced:Adam\.{root}lin\.weight\.exp_avg", opt.state[w]["exp_avg"]),
    ]:
        found = [k for k in rows if re.fullmatch(pattern, k)]
        assert len(found) == 1, (pattern, sorted(rows))
        assert rows[found[0]] == nbytes(tensor)


class Broken(torch.nn.Module):
    """A module whose own methods fail while the Tracer looks for names."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1000))

    def named_parameters(self, *args, **kwargs):
        raise RuntimeError("not now")


def test_a_module_that_cannot_list_its_tensors_leaves_the_others_named():
    broken = Broken()
    model, opt, train_step = trained_probe()
    with trace.Tracer(device="cpu") as tr:
        train_step()
    keys = {r.location for r in tr.result.module_rows("cpu")}
    assert any(k.endswith("lin.weight") and k.startswith("untraced:") for k in keys), keys
    assert not any(k.endswith(".w") for k in keys)
    assert_views_agree(tr.result)
    del broken


def test_start_names_survive_saving_and_loading(tmp_path):
    model, opt, train_step = trained_probe()
    with trace.Tracer(device="cpu", model=model) as tr:
        train_step()
    rows = tr.result.module_rows("cpu")
    assert any(r.location == "untraced:lin.weight" for r in rows)
    for name in ("t.pickle", "t.json.gz"):
        tr.result.save(tmp_path / name)
        assert trace.load(tmp_path / name).module_rows("cpu") == rows


@pytest.mark.parametrize(
    "names",
    [[[1]], [["x", "w"]], [[-1, "w"]], "abc", [[1, "w", 2]], 5],
)
def test_bad_start_names_are_named(names):
    snapshot, _ = history([(64, True)], [])
    snapshot["memlab_rs"]["start"]["names"] = names
    with pytest.raises(ValueError, match=r"'memlab_rs.start.names' holds \[address, name\] pairs"):
        trace.load(snapshot)


# -- keyword groups: Untrackable is never negative, and never dropped without a word ---------
def mlp_adam():
    import pickle

    with open(FIXTURES / "trace" / "mlp_adam.pickle", "rb") as f:
        data = pickle.load(f)
    return trace.load(data["snapshot"]), data["facts"]["peak_allocated"]


GROUPS = {"first": ["step0"], "later": ["step1", "step2"]}


@settings(max_examples=50, deadline=None)
@given(offset=st.integers(-(1 << 40), 1 << 40))
def test_untrackable_is_what_expected_sum_leaves_and_never_negative(offset):
    result, peak = mlp_adam()
    assert result.max_mem(0) == peak
    expected = max(0, peak + offset)
    if expected < peak:
        with pytest.raises(ValueError, match=f"expected_sum={expected} is less than the {peak} "):
            result.keywords(GROUPS, expected)
        return
    groups = dict(result.keywords(GROUPS, expected))
    assert groups["Untrackable"] == expected - peak >= 0
    assert sum(groups.values()) == expected


def test_bad_expected_sum_is_named():
    result, peak = mlp_adam()
    for bad in (True, 1.5, "reserved", [1]):
        error = ValueError if isinstance(bad, str) else TypeError
        with pytest.raises(error, match=r"expected_sum \(bytes, None or 'driver'\)"):
            result.keywords(GROUPS, bad)
    import numpy as np

    assert dict(result.keywords(GROUPS, np.int64(peak)))["Untrackable"] == 0


def test_the_default_driver_is_not_dropped_without_a_word(tmp_path):
    with trace.Tracer(device="cpu") as tr:
        w = torch.empty(256, 1024)
    cpu = tr.result
    with pytest.warns(UserWarning, match="this trace recorded CPU memory.*Untrackable is left out"):
        found = cpu.keywords({"all": ["untraced"]})
    assert [name for name, _ in found] == ["all", "Others"]
    # Bytes, or None, say what is wanted: no warning.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [n for n, _ in cpu.keywords({"all": ["untraced"]}, None)] == ["all", "Others"]
    # A CUDA trace read from a file: the driver here says nothing of that recording.
    result, _ = mlp_adam()
    for name in ("cuda.pickle", "cuda.json.gz"):
        result.save(tmp_path / name)
        loaded = trace.load(tmp_path / name)
        with pytest.warns(UserWarning, match="read from a file.*Untrackable is left out"):
            found = loaded.keywords(GROUPS)
        assert [name for name, _ in found] == ["first", "later", "Others"]
    del w
