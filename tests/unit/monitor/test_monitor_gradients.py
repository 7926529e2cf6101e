"""The training monitor's "Intermediate gradients": the gradients a backward passes between
the graph's nodes that never become a leaf's ``.grad`` (the gradients of non-leaf tensors),
the most bytes of them alive at once. Checked by hand on a chain, and against torch's own
memory profiler (which follows every CPU allocation and names intermediate gradients
``AUTOGRAD_DETAIL``) on a NeuMF-like recommender and on random chains.

It was the backward's allocator peak, less the start, less the parameter gradients created,
clamped at 0: backward frees saved activations as it goes, so that read 0 MB while
megabytes of gradients were alive."""

from __future__ import annotations

import io
import warnings
import weakref

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from neumf import NeuMF
from torch import nn

import memlab_rs

# The loss's own gradient (a float32 scalar torch.autograd.backward makes): alive for the
# whole backward, counted (a gradient of a non-leaf tensor); torch's profiler files it
# elsewhere, as it is made before the engine runs.
SEED = 4


def monitored(model, step, steps=4, **options):
    with memlab_rs.memory_profiler(model, file=io.StringIO(), **options) as monitor:
        for _ in range(steps):
            step()
            monitor.record_stats()
    return monitor


def test_a_chain_by_hand():
    # Linear(1000, 500) -> ReLU -> Linear(500, 10), batch 8, loss = sum. Node by node: the
    # second Linear returns the ReLU output's gradient (8 x 500) and the gradient of
    # weight.t(), which becomes the weight's .grad (a weight gradient: not counted); ReLU's
    # backward returns its input's gradient (8 x 500) while it still holds what it got.
    n, width = 8, 500
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1000, width), nn.ReLU(), nn.Linear(width, 10))
    monitor = monitored(model, lambda: model(torch.randn(n, 1000)).sum().backward(), steps=5)
    rows = monitor.rows()
    assert [r["feature_maps_from"] for r in rows] == [1, 2, 3, 3, 3]
    assert [r["intermediate_gradients"] for r in rows] == [SEED + 2 * n * width * 4] * 5
    assert monitor.text().endswith("\nIntermediate gradients.................0 MB")


def profiled_intermediate_gradients(step) -> int:
    """The most bytes torch's memory profiler files as AUTOGRAD_DETAIL (intermediate
    gradients) alive at once during ``step``: an independent count, allocation by
    allocation, from the CPU allocator's own events."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action, Category

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(
            activities=[ProfilerActivity.CPU],
            profile_memory=True,
            record_shapes=True,
            with_stack=True,
        ) as prof:
            step()
        memory = prof._memory_profile()
    alive = peak = 0
    for _time, action, (key, version), size in memory.timeline:
        category = memory._categories.get(key, version)
        if action in (Action.CREATE, Action.PREEXISTING):
            alive += size if category == Category.AUTOGRAD_DETAIL else 0
        elif action == Action.DESTROY:
            alive -= size if category == Category.AUTOGRAD_DETAIL else 0
        elif action == Action.INCREMENT_VERSION:
            before = memory._categories.get(key, version - 1)
            alive -= size if before == Category.AUTOGRAD_DETAIL else 0
            alive += size if category == Category.AUTOGRAD_DETAIL else 0
        peak = max(peak, alive)
    return peak


def test_a_neumf_recommender_against_torchs_profiler():
    torch.manual_seed(0)
    model = NeuMF()
    optimizer = torch.optim.Adam(model.parameters())
    batch = 4096
    user, item = torch.randint(0, 1000, (batch,)), torch.randint(0, 2000, (batch,))
    label = torch.rand(batch)

    def step():
        out = model(user, item)
        nn.functional.binary_cross_entropy_with_logits(out, label).backward()
        optimizer.step()
        optimizer.zero_grad()

    monitor = monitored(model, step, optimizer=optimizer)
    expected = profiled_intermediate_gradients(step) + SEED
    assert expected > 1_500_000  # the block printed 0 MB here
    assert [r["intermediate_gradients"] for r in monitor.rows()] == [expected] * 4
    assert "\nIntermediate gradients.................2 MB\n" in monitor.text()


ACTIVATIONS = [nn.ReLU, nn.Tanh, nn.Sigmoid, nn.GELU]


@settings(
    max_examples=25,
    deadline=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    batch=st.integers(1, 16),
    widths=st.lists(st.integers(1, 64), min_size=2, max_size=6),
    activations=st.lists(st.integers(0, len(ACTIVATIONS) - 1), min_size=5, max_size=5),
    bias=st.booleans(),
    input_grad=st.booleans(),
)
def test_random_chains_against_torchs_profiler(batch, widths, activations, bias, input_grad):
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers += [nn.Linear(a, b, bias=bias), ACTIVATIONS[activations[i]]()]
    model = nn.Sequential(*layers)
    x = torch.randn(batch, widths[0], requires_grad=input_grad)

    def step():
        model(x).square().mean().backward()
        model.zero_grad(set_to_none=True)
        x.grad = None

    (row,) = monitored(model, step, steps=1, feature_maps="every").rows()
    assert row["intermediate_gradients"] == profiled_intermediate_gradients(step) + SEED


def test_each_backward_of_an_iteration_counts_and_the_largest_is_kept():
    # Gradient accumulation: two backwards of batches 8 and 32 in one iteration.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(100, 50), nn.ReLU(), nn.Linear(50, 10))

    def step():
        for batch in (8, 32):
            model(torch.randn(batch, 100)).sum().backward()

    (row,) = monitored(model, step, steps=1).rows()
    assert row["backward_passes"] == 2
    assert row["intermediate_gradients"] == SEED + 2 * 32 * 50 * 4


def test_a_retained_graph_is_watched_once_per_backward_and_left_without_our_hooks():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(100, 50), nn.ReLU(), nn.Linear(50, 10))
    loss = model(torch.randn(8, 100)).sum()
    logs = []
    with memlab_rs.memory_profiler(model, file=io.StringIO()) as monitor:
        # A hook on the loss runs first in each backward: the monitor's log is on by then.
        hook = loss.register_hook(lambda grad: logs.append(weakref.ref(monitor._grad_log)))
        loss.backward(retain_graph=True)
        loss.backward(retain_graph=True)
        monitor.record_stats()
        hook.remove()
    assert monitor.rows()[0]["intermediate_gradients"] == SEED + 2 * 8 * 50 * 4
    # Each backward had its own log, and the retained graph holds neither: the hooks that
    # would (one per node) were taken off when each backward returned.
    assert len(logs) == 2 and logs[0]() is None and logs[1]() is None
    loss.backward()  # and the graph runs as before


def test_an_unmeasured_iteration_has_no_figure():
    # A change the inputs do not show (tests/test_monitor_measuring.py): n/a, as its
    # feature maps, and the next iteration is measured again.
    model = nn.Sequential(nn.Linear(100, 50), nn.Tanh())
    extra = []

    def step():
        out = model(torch.randn(8, 100))
        (out.exp() if extra else out).sum().backward()

    with memlab_rs.memory_profiler(model, file=io.StringIO()) as monitor:
        for i in range(6):
            if i == 4:
                extra.append(True)
            step()
            monitor.record_stats()
    rows = monitor.rows()
    assert [r["feature_maps_from"] for r in rows] == [1, 2, 3, 3, None, 6]
    assert rows[4]["intermediate_gradients"] is None
    assert "Intermediate gradients...............n/a" in monitor.text(5)
    # exp's backward holds its gradient beside what it returns: two 8 x 50 gradients.
    assert rows[5]["intermediate_gradients"] == SEED + 2 * 8 * 50 * 4


class ResidualBlock(nn.Module):
    """x + MLP(LayerNorm(x)): x's gradient comes from two nodes and torch sums the second
    into the first's buffer in place, unless something holds that buffer's storage."""

    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


def test_measuring_changes_nothing_a_residual_network_allocates():
    # Reading each gradient's storage object (a weak reference to it) kept torch from
    # summing residual gradients in place: every measured backward allocated more, so no
    # unmeasured iteration matched a measured one ([1, 2, 3, None, 5, None]; on a GPT-2 on
    # an H100, two 2 MiB and four 512 KiB blocks more).
    torch.manual_seed(0)
    model = nn.Sequential(*[ResidualBlock(256) for _ in range(3)])
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(64, 256)

    def step():
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    rows = monitored(model, step, steps=6, optimizer=optimizer, device="cpu").rows()
    assert [r["feature_maps_from"] for r in rows] == [1, 2, 3, 3, 3, 3]
    assert len({r["peak_allocated"] for r in rows}) == 1
    assert len({r["intermediate_gradients"] for r in rows}) == 1
    # The loss's 4-byte seed, the residual stream's gradient (64 x 256 float32) waiting for
    # the block below while the MLP's (64 x 1024) is made and returned: at least those.
    assert rows[0]["intermediate_gradients"] >= SEED + 64 * 256 * 4 + 64 * 1024 * 4
