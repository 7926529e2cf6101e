"""memlab_rs.estimate on models that read their tensors on the host (``if mask.all()``,
``int(lengths.max())``, ``x[mask]``, ``nonzero``): the values a real step knows (computed
from the inputs and the buffers) are known to the fake step too, so it takes the real
step's branches and shapes; each estimate is checked against the CPU source's peak of a
real step on the same inputs. A value computed from the weights stays unknown: a clear
FakeStepError naming the op."""

from __future__ import annotations

import pytest
import torch
from cpu_step_rises import cpu_step_rises
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memlab_rs import FakeStepError, estimate
from memlab_rs._sources import cpu_source as _cpu_source

needs_cpu_hook = pytest.mark.skipif(
    _cpu_source.library() is None, reason="this torch has no libc10.so (the fallback is used)"
)


class PaddedBatch(torch.nn.Module):
    """Reads its padding mask on the host, as models fed by a tokenizer do."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 64)
        self.proj = torch.nn.Linear(64, 64)
        # Each weight and activation is used once: a tensor used twice has its gradients
        # summed, in place in a real step and out of place on fake tensors (autograd's
        # InputBuffer and AccumulateGrad treat tensor subclasses apart), which is not what
        # this file tests.
        self.pick = torch.nn.Embedding(50, 8)
        self.register_buffer("scale", torch.tensor([1.0, 0.5]))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        if not mask.all():  # padding: squash the padded positions (tanh saves its output)
            x = torch.tanh(x * mask[..., None])
        longest = int(mask.sum(-1).max())  # trim the batch to its longest sequence
        x = self.proj(x[:, :longest])
        kept = x[mask[:, :longest].bool()]  # a boolean index: as many rows as real tokens
        picked = torch.nonzero(mask[0]).flatten()  # indices: a shape from the data
        first = self.pick(ids[0].index_select(0, picked[picked < longest]))
        return kept.square().sum() * self.scale[int(mask[0, 0].item() == 0)] + first.sum()


def _real_rises(model, ids, mask):
    def step():
        loss = model(ids, mask)
        loss.backward()
        for p in model.parameters():
            p.grad = None

    return cpu_step_rises(step, 1)


def _estimated_rise(est):
    return est.step_peaks[1] - est.phase_ends["setup"]


def _mask(lengths: list[int], width: int) -> torch.Tensor:
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()


@needs_cpu_hook
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 6).flatmap(
        lambda batch: st.tuples(
            st.integers(8, 96), st.lists(st.integers(1, 96), min_size=batch, max_size=batch)
        )
    )
)
def test_each_batch_is_estimated_as_its_real_step_runs(width_lengths):
    width, lengths = width_lengths
    lengths = [min(n, width) for n in lengths]
    torch.manual_seed(0)
    model = PaddedBatch()
    ids = torch.randint(0, 50, (len(lengths), width))
    mask = _mask(lengths, width)
    est = estimate(model, (ids, mask), device="cpu", loss_fn=lambda out: out)
    real = _real_rises(model, ids, mask)[1]
    # The branches and shapes are the real step's; the CPU kernels' own few bytes (nonzero's
    # and boolean indexing's index buffers) are not modelled: the acceptance bound, 3% of
    # the step's peak.
    assert abs(_estimated_rise(est) - real) <= 0.03 * (real + est.phase_ends["setup"])


def test_the_padded_and_the_unpadded_batch_differ_as_their_branches_do():
    model = PaddedBatch()
    ids = torch.zeros(4, 64, dtype=torch.long)
    full = estimate(model, (ids, _mask([64] * 4, 64)), device="cpu", loss_fn=lambda out: out)
    padded = estimate(model, (ids, _mask([64, 64, 64, 63], 64)), device="cpu", loss_fn=lambda o: o)
    # Only the padded batch takes the branch: the product and the tanh, and their gradients.
    assert padded.allocations - full.allocations == 4


def test_a_value_computed_from_the_weights_is_a_clear_error_naming_the_op():
    class RoutedByWeights(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.router = torch.nn.Linear(8, 1)

        def forward(self, x):
            keep = self.router(x).squeeze(-1) > 0  # unknown: the weights are fake
            return x[keep.nonzero(as_tuple=True)].sum()

    with pytest.raises(FakeStepError, match="nonzero|index"):
        estimate(RoutedByWeights(), torch.ones(4, 8), device="cpu")


def test_a_value_written_in_place_from_the_weights_is_forgotten():
    class Overwritten(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4))

        def forward(self, mask):
            m = mask.clone()
            m.copy_(self.w > 0)  # now computed from the weights: no longer known
            return self.w[m.bool()].sum()

    with pytest.raises(FakeStepError):
        estimate(Overwritten(), torch.ones(4, dtype=torch.long), device="cpu")


def test_the_inputs_and_the_model_are_untouched():
    model = PaddedBatch()
    ids = torch.randint(0, 50, (2, 16))
    mask = _mask([16, 9], 16)
    before = (ids.clone(), mask.clone(), {k: v.clone() for k, v in model.state_dict().items()})
    estimate(model, (ids, mask), device="cpu", loss_fn=lambda out: out)
    assert torch.equal(ids, before[0]) and torch.equal(mask, before[1])
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[2][k])


class LayerDrop(torch.nn.Module):
    """Skips each layer with probability `p` on a random draw, as OPT's and BART's layerdrop."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if torch.rand([]) < self.p:  # a host read of a random value
                continue
            x = torch.tanh(layer(x))
        return x.sum()


@needs_cpu_hook
def test_a_branch_on_a_random_draw_runs_and_leaves_the_users_generator_alone():
    model, x = LayerDrop(0.0), torch.ones(8, 32)
    state = torch.get_rng_state()
    est = estimate(model, x, device="cpu", loss_fn=lambda out: out)
    assert torch.equal(torch.get_rng_state(), state)  # no draw from the user's generator
    real = _real_step_rise(model, x)
    assert _estimated_rise(est) == real  # p = 0: every layer runs, as in every real step
    # p = 1: no layer runs (nothing to differentiate: forward only), nothing is saved.
    skipped = estimate(LayerDrop(1.0), x, device="cpu", loss_fn=lambda out: out, backward=False)
    assert skipped.activations == 0 and est.activations > 0


def _real_step_rise(model, x):
    def step():
        model(x).backward()
        for p in model.parameters():
            p.grad = None

    return cpu_step_rises(step, 1)[1]


def test_a_known_value_written_through_a_boolean_mask_stays_right():
    class Cleared(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, mask):
            m = mask.clone()
            # Every set position cleared (index_put_: `m[m.bool()] = 0` takes masked_fill_).
            m.index_put_((m.bool(),), torch.zeros((), dtype=m.dtype))
            if m.any():  # never true in a real step; a stale value would take it
                x = x.repeat(1000, 1)
            return self.lin(x).sum()

    x = torch.ones(2, 4)
    ones = estimate(Cleared(), (x, torch.ones(2, dtype=torch.long)), device="cpu", loss_fn=id_)
    zeros = estimate(Cleared(), (x, torch.zeros(2, dtype=torch.long)), device="cpu", loss_fn=id_)
    assert ones.peak_allocated == zeros.peak_allocated


def id_(out):
    return out


class _EveryAddressOnceUnknown(set):
    """``KnownValues._unknown`` as it is when every storage address was, at some time,
    a storage written without a known value: the worst of address reuse, deterministic.
    An address counts as unknown until it is discarded (a new storage claimed it)."""

    def __contains__(self, key: object) -> bool:
        return key not in self.claimed

    def __init__(self) -> None:
        super().__init__()
        self.claimed: set[object] = set()

    def discard(self, key: object) -> None:
        self.claimed.add(key)


def test_a_new_tensors_value_stands_where_a_freed_storage_was_unknown():
    """Unknown values are kept by storage address; a storage freed and another made at its
    address (likely: the addresses are the C++ storages') must not inherit the mark. The
    fakes the known values make themselves (a host read's result, a mask's indices, an
    input's copy) are new storages: their values stand."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memlab_rs.estimation._known_values import KnownValues

    known = KnownValues()
    known._unknown = _EveryAddressOnceUnknown()
    real_mask = torch.tensor([True, False, True, True])
    with FakeTensorMode():
        mask = torch.empty(4, dtype=torch.bool)
        x = torch.empty(4, 3)
    known.remember(mask, real_mask)
    assert torch.equal(known.value(mask), real_mask)
    with FakeTensorMode(allow_non_fake_inputs=True):
        indices = known.answer(torch.ops.aten.nonzero.default, (mask,), {})
        picked = known.answer(torch.ops.aten.index.Tensor, (x, [mask]), {})
    assert tuple(indices.shape) == (3, 1)
    assert torch.equal(known.value(indices), torch.tensor([[0], [2], [3]]))
    assert tuple(picked.shape) == (3, 3)
    (made,) = known.made
    assert torch.equal(known.value(made), torch.tensor([0, 2, 3]))
