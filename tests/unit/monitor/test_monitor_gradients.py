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


class NeuMF(nn.Module):
    """Neural matrix factorisation (He et al. 2017): a generalised matrix factorisation of
    user and item embeddings beside an MLP over two more, joined by one output layer."""

    def __init__(self, users=1000, items=2000, factors=8, layers=(64, 32, 16, 8)):
        super().__init__()
        self.gmf_user = nn.Embedding(users, factors)
        self.gmf_item = nn.Embedding(items, factors)
        self.mlp_user = nn.Embedding(users, layers[0] // 2)
        self.mlp_item = nn.Embedding(items, layers[0] // 2)
        mlp: list[nn.Module] = []
        for a, b in zip(layers, layers[1:]):
            mlp += [nn.Linear(a, b), nn.ReLU()]
        self.mlp = nn.Sequential(*mlp)
        self.predict = nn.Linear(factors + layers[-1], 1)

    def forward(self, user, item):
        gmf = self.gmf_user(user) * self.gmf_item(item)
        mlp = self.mlp(torch.cat([self.mlp_user(user), self.mlp_item(item)], dim=-1))
        return self.predict(torch.cat([gmf, mlp], dim=-1)).squeeze(-1)


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
