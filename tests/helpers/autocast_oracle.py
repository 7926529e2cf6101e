"""The CUDA autocast oracle without a GPU: a forward on fake meta tensors with the
estimate's emulation (``_cuda_dispatch``) against the same forward on fake CUDA tensors,
where torch's own C++ autocast runs (switched on for the thread with
``torch.set_autocast_enabled("cuda", True)``, past ``torch.autocast``'s check for a GPU).
Both must allocate the same storages (op, dtype, bytes), in the same order.

Run as a script (``python autocast_oracle.py [EXAMPLES]``: a fake CUDA forward without a GPU
aborts some torch versions, so it runs in an interpreter of its own): prints one JSON object,
``{"named": {case: null or the first difference}, "random": [...failures...], "examples": n}``.
Without a GPU, fake CUDA tensors can only run SDPA's math kernel, so both sides run under
``sdpa_kernel(SDPBackend.MATH)`` (the flash and memory-efficient choices are checked on
meta in tests/unit/estimate).
"""

from __future__ import annotations

import contextlib
import json
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from memlab_rs.estimation import _fake_step as fs
from memlab_rs.estimation._cuda_dispatch import CudaDispatch


def forward_allocations(model, inputs, run_on: str, amp, loss=None) -> list[list]:
    """[op, dtype, bytes] of every storage the forward and the loss allocate, run on fake
    `run_on` tensors in a CUDA autocast region of dtype `amp` (None: no region)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    book = fs.Book("cuda")
    book.counts = lambda t: t.device.type == run_on
    seen: list[list] = []
    see = book.see

    def record(t, origin, category="temporary"):
        new = len(book.categories)
        ident = see(t, origin, category)
        if ident == new:
            seen.append([origin.split(" (")[0], str(t.dtype), t.untyped_storage().nbytes()])
        return ident

    book.see = record
    book.phase_begin("setup")
    fake = fs.fake_model(model, mode, torch.device(run_on), None)
    x = fs.fake_inputs(inputs, mode, torch.device(run_on), None)
    for t in fs.output_tensors([x]):
        book.see(t, "input", "input")
    book.phase_begin("forward 1")
    seen.clear()
    dispatch = CudaDispatch(book) if run_on == "meta" else None
    if amp is None:
        region = contextlib.nullcontext()
    else:
        region = dispatch.autocast(amp) if dispatch else _real_cuda_autocast(amp)
    below = dispatch.exclude_below if dispatch else None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with mode, dispatch or contextlib.nullcontext(), fs._Recorder(book, None, below):
        with sdpa_kernel(SDPBackend.MATH), region:
            out = fake(x)
            out = loss(out) if loss is not None else out.float().sum()
    return seen


@contextlib.contextmanager
def _real_cuda_autocast(dtype):
    """CUDA's C++ autocast for this thread, as ``torch.autocast("cuda")`` enters it."""
    enabled, previous = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled("cuda", enabled)
        torch.set_autocast_dtype("cuda", previous)


def first_difference(a: list, b: list) -> dict | None:
    """Where the storages (dtype, bytes) first differ; the ops are shown, not compared (a
    kernel modelled on meta allocates through other ops)."""
    if [x[1:] for x in a] == [y[1:] for y in b]:
        return None
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x[1:] != y[1:]), min(len(a), len(b)))
    return {"at": i, "emulated": a[i : i + 3], "real": b[i : i + 3], "lengths": [len(a), len(b)]}


# -- named models ---------------------------------------------------------------------------


class Block(nn.Module):
    """A pre-norm transformer block: layer norm, SDPA, a GELU MLP."""

    def __init__(self, d: int = 64, heads: int = 4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


def _conv_net():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )  # fmt: skip


def _cross_entropy(out):
    return F.cross_entropy(out, torch.zeros(out.shape[0], dtype=torch.long, device=out.device))


NAMED = {
    "transformer block (SDPA, layer norm)": (Block, lambda: torch.zeros(2, 16, 64), None),
    "conv net (batch norm)": (_conv_net, lambda: torch.zeros(2, 3, 16, 16), None),
    "MLP (GELU, dropout, cross-entropy)": (
        lambda: nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 10)),
        lambda: torch.zeros(8, 32),
        _cross_entropy,
    ),
    "nn.TransformerEncoderLayer (MultiheadAttention)": (
        lambda: nn.TransformerEncoderLayer(64, 4, 128, batch_first=True),
        lambda: torch.zeros(2, 16, 64),
        None,
    ),
}


# -- random stacks --------------------------------------------------------------------------


class Channels(nn.Module):
    """(B, T, D) -> (B, D, T) for a channels-first module, and back."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x.transpose(1, 2)).transpose(1, 2)


class Fn(nn.Module):
    def __init__(self, name: str, d: int):
        super().__init__()
        self.name = name
        self.w = nn.Parameter(torch.zeros(d, d))

    def forward(self, x):
        n = self.name
        if n == "matmul":
            return x @ self.w
        if n == "einsum":
            return torch.einsum("btd,de->bte", x, self.w)
        if n == "bmm":
            return torch.bmm(x, self.w.expand(x.shape[0], -1, -1))
        if n == "baddbmm":
            return torch.baddbmm(x, x, self.w.expand(x.shape[0], -1, -1))
        if n == "exp":
            return torch.exp(x)
        if n == "pow":
            return x.pow(2) + x
        if n == "log1p":
            return torch.log1p(x.abs())
        if n == "rsqrt":
            return torch.rsqrt(x.abs() + 1)
        if n == "cumsum":
            return x.cumsum(-1)
        if n == "sum":
            return x + x.sum(-1, keepdim=True)
        if n == "cat":
            return torch.cat([x, x @ self.w], -1)[..., : x.shape[-1]]
        if n == "addcmul":
            return torch.addcmul(x, x @ self.w, x)
        if n == "softplus":
            return F.softplus(x)
        if n == "norm":
            return x / x.norm(dim=-1, keepdim=True)
        if n == "residual":
            return x + F.linear(x, self.w)
        if n == "disabled":  # a region model code turns off, as rotary embeddings do
            with torch.autocast(x.device.type, enabled=False):  # "meta" on the meta side
                return x.float() @ self.w
        raise ValueError(n)


FNS = (
    "matmul", "einsum", "bmm", "baddbmm", "exp", "pow", "log1p", "rsqrt", "cumsum", "sum",
    "cat", "addcmul", "softplus", "norm", "residual", "disabled",
)  # fmt: skip
LAYERS = (
    "linear", "layer_norm", "rms_norm", "group_norm", "batch_norm", "conv1d", "gelu", "relu",
    "silu", "softmax", "log_softmax", "dropout", "sdpa", "mha", "fn",
)  # fmt: skip


def build(spec: list[tuple], d: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(d, d)]
    for kind, arg in spec:
        if kind == "linear":
            layers += [nn.Linear(d, arg), nn.Tanh()]
            d = arg
        elif kind == "layer_norm":
            layers.append(nn.LayerNorm(d))
        elif kind == "rms_norm" and hasattr(nn, "RMSNorm"):
            layers.append(nn.RMSNorm(d))
        elif kind == "group_norm":
            layers.append(Channels(nn.GroupNorm(2, d)))
        elif kind == "batch_norm":
            layers.append(Channels(nn.BatchNorm1d(d)))
        elif kind == "conv1d":
            layers.append(Channels(nn.Conv1d(d, d, 3, padding=1)))
        elif kind in ("gelu", "relu", "silu"):
            layers.append({"gelu": nn.GELU(), "relu": nn.ReLU(), "silu": nn.SiLU()}[kind])
        elif kind == "softmax":
            layers.append(nn.Softmax(-1))
        elif kind == "log_softmax":
            layers.append(nn.LogSoftmax(-1))
        elif kind == "dropout":
            layers.append(nn.Dropout(0.1))
        elif kind == "sdpa":
            layers.append(Block(d, 2))
        elif kind == "mha":
            layers.append(nn.TransformerEncoderLayer(d, 2, 2 * d, batch_first=True))
        elif kind == "fn":
            layers.append(Fn(FNS[arg % len(FNS)], d))
    return nn.Sequential(*layers)


def random_failures(examples: int) -> list[dict]:
    """Random stacks (hypothesis) whose emulated and real allocations differ."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    failures: list[dict] = []
    layer = st.tuples(st.sampled_from(LAYERS), st.integers(1, 4).map(lambda k: 8 * k))
    fn = st.tuples(st.just("fn"), st.integers(0, len(FNS) - 1))

    @settings(
        max_examples=examples, deadline=None, database=None, derandomize=True,
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @given(
        spec=st.lists(st.one_of(layer, fn), min_size=1, max_size=5),
        batch=st.integers(1, 3),
        tokens=st.integers(2, 6),  # batch norm needs more than one value per channel
        amp=st.sampled_from([torch.bfloat16, torch.float16]),
        loss=st.sampled_from(["sum", "cross_entropy", "mse"]),
    )
    def check(spec, batch, tokens, amp, loss):
        torch.manual_seed(0)
        model = build(spec, 16)
        x = torch.zeros(batch, tokens, 16)

        def loss_fn(out):
            if loss == "cross_entropy":
                flat = out.flatten(0, 1)
                targets = torch.zeros(flat.shape[0], dtype=torch.long, device=out.device)
                return F.cross_entropy(flat, targets)
            if loss == "mse":
                return F.mse_loss(out, torch.zeros_like(out))
            return out.float().sum()

        emulated = forward_allocations(model, x, "meta", amp, loss_fn)
        real = forward_allocations(model, x, "cuda", amp, loss_fn)
        difference = first_difference(emulated, real)
        if difference is not None:
            failures.append({"spec": spec, "amp": str(amp), "loss": loss, **difference})

    check()
    return failures


def main(examples: int) -> dict:
    named = {}
    for name, (make, inputs, loss) in NAMED.items():
        for amp in (torch.bfloat16, torch.float16, None):
            torch.manual_seed(0)
            model, x = make(), inputs()
            emulated = forward_allocations(model, x, "meta", amp, loss)
            real = forward_allocations(model, x, "cuda", amp, loss)
            named[f"{name}, {amp}"] = first_difference(emulated, real)
    failures = random_failures(examples) if examples > 0 else []
    return {"named": named, "random": failures, "examples": examples}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 40), default=str))
