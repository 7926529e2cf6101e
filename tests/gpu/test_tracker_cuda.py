"""MemTracker on a GPU: real models (transformers GPT-2, torchvision ResNet-50, random
weights), exact storage bytes against an independent count, names from the model, and the
diff across a training step; the original tool's README example (VGG-19) row for row."""

from __future__ import annotations

import gc

import pytest
import torch
from torch._subclasses.fake_tensor import is_fake
from tracker_readme import README_BLOCKS, vgg19_features

from memlab_rs import MemTracker

pytestmark = pytest.mark.cuda


def _rounded(nbytes: int) -> int:
    """What the caching allocator charges a storage: a multiple of 512 bytes."""
    return (nbytes + 511) // 512 * 512


def _storages_on(device: str) -> int:
    """Bytes of every CUDA storage Python can reach, each once: an independent count."""
    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device == torch.device(device):
            if is_fake(obj):  # an estimate's or torch.compile's: no memory behind it
                continue
            storage = obj.untyped_storage()
            if storage.data_ptr() == 0:  # meta-like: no memory either
                continue
            seen[storage.data_ptr()] = _rounded(storage.nbytes())
    return sum(seen.values())


def _largest_on(device: str) -> list[tuple[int, str, str, list[str]]]:
    """The largest storages gc reaches on ``device``, with what refers to them: what a
    failed comparison with MemTracker's total shows."""
    found = []
    for obj in gc.get_objects():
        if (
            isinstance(obj, torch.Tensor)
            and obj.device == torch.device(device)
            and not is_fake(obj)
        ):
            holders = [type(r).__name__ for r in gc.get_referrers(obj)][:5]
            found.append(
                (obj.untyped_storage().nbytes(), type(obj).__name__, str(tuple(obj.shape)), holders)
            )
    return sorted(found, reverse=True)[:5]


def _names(result) -> set[str]:
    """Every name the rows give, tied names ('a+b', 'a+b.grad') split into one each."""
    out = set()
    for row in result.rows:
        for name in row.names:
            base, grad = (name[:-5], ".grad") if name.endswith(".grad") else (name, "")
            out.update(part + grad for part in base.split("+"))
    return out


def test_gpt2_parameters_then_a_training_step(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=256, n_head=4)
    gc.collect()
    tracker = MemTracker(path=f"{tmp_path}/", device=0)
    tracker.track()
    model = transformers.GPT2LMHeadModel(config).cuda()
    tracker = MemTracker(path=f"{tmp_path}/", device=0, model=model)
    first = tracker.track()
    assert first.total_bytes == _storages_on("cuda:0")
    assert first.allocated_bytes == torch.cuda.memory_allocated(0)
    assert first.total_bytes <= first.allocated_bytes
    names = _names(first)
    assert "transformer.h.0.attn.c_attn.weight" in names
    # The tied LM head and token embedding are one storage, listed once under both names.
    tied = [r for r in first.rows if "transformer.wte.weight+lm_head.weight" in r.names]
    assert len(tied) == 1
    assert tied[0].bytes == _rounded(config.vocab_size * config.n_embd * 4)

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (2, 64), device="cuda")
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    del ids
    step = tracker.track()
    assert step.total_bytes == _storages_on("cuda:0")
    # Every parameter's grad appeared under its name (grads share rows with AdamW's state
    # of the same shape: the rows group by type, shape and dtype).
    expected = {f"{name}.grad" for name, _ in model.named_parameters(remove_duplicate=False)}
    assert {n for n in _names(step) if n.endswith(".grad")} == expected
    params = list({p.data_ptr(): p for p in model.parameters()}.values())
    grads = sum(_rounded(p.grad.untyped_storage().nbytes()) for p in params)
    # AdamW's state: exp_avg and exp_avg_sq (its steps are CPU scalars).
    state = sum(
        _rounded(v.untyped_storage().nbytes())
        for s in opt.state.values()
        for v in s.values()
        if torch.is_tensor(v) and v.is_cuda
    )
    added = sum(r.bytes for r in step.rows if r.sign == "+")
    assert added == grads + state, [r.line for r in step.rows]
    assert step.total_bytes - first.total_bytes == added


def test_resnet50_activations_appear_and_vanish(tmp_path):
    models = pytest.importorskip("torchvision.models")
    model = models.resnet50().cuda()
    x = torch.randn(8, 3, 224, 224, device="cuda")
    tracker = MemTracker(path=f"{tmp_path}/", device="cuda:0", model=model)
    first = tracker.track()
    # Parameters and batch-norm buffers are named after the model.
    assert {"conv1.weight", "bn1.running_mean", "fc.weight"} <= _names(first)
    with torch.no_grad():  # with grad, autograd keeps every activation's tensor alive too
        out = model(x)
    appeared = tracker.track()
    plus = [r for r in appeared.rows if r.sign == "+"]
    assert [(r.count, r.shape, r.bytes) for r in plus] == [(1, "(8, 1000)", _rounded(8 * 1000 * 4))]
    assert appeared.total_bytes == _storages_on("cuda:0")
    del out
    vanished = tracker.track()
    assert [(r.sign, r.shape) for r in vanished.rows] == [("-", "(8, 1000)")]
    # With grad, the activations autograd saved appear as well, each storage once.
    out = model(x)
    with_grad = tracker.track()
    assert with_grad.total_bytes == _storages_on("cuda:0")
    assert sum(r.bytes for r in with_grad.rows if r.sign == "+") == (
        with_grad.total_bytes - vanished.total_bytes
    )
    del out
    with open(tracker.gpu_profile_fn) as f:
        log = f.read()
    assert "+ | 1 * Size:(8, 1000)" in log and "- | 1 * Size:(8, 1000)" in log


def test_the_original_readme_example_prints_as_the_original(tmp_path):
    # Pytorch-Memory-Utils' README, run as it is there (VGG-19's features on the GPU, five
    # dummy tensors, two moved back): every row prints as that README prints it, though the
    # allocator holds (64, 3, 3, 3) float32 in 7168 bytes of 512-byte blocks for its 6912,
    # and each (64,) in 512 for 256 (which printed 0.0068 M and 0.0009 M).
    gc.collect()
    torch.cuda.empty_cache()
    tracker = MemTracker(path=f"{tmp_path}/", device=0)
    start = tracker.track()
    cnn = vgg19_features().to("cuda:0").eval()
    blocks = [tracker.track()]
    at_first = _storages_on("cuda:0"), _largest_on("cuda:0")  # what gc reaches right then
    d1 = torch.empty(30, 3, 512, 512, device="cuda:0")
    d2 = torch.empty(40, 3, 512, 512, device="cuda:0")
    d3 = torch.empty(60, 3, 512, 512, device="cuda:0")
    blocks.append(tracker.track())
    d4 = torch.empty(120, 3, 512, 512, device="cuda:0")
    d5 = torch.empty(80, 3, 512, 512, device="cuda:0")
    blocks.append(tracker.track())
    d4 = d4.cpu()
    d2 = d2.cpu()
    tracker.clear_cache()
    blocks.append(tracker.track())
    for result, (rows, total) in zip(blocks, README_BLOCKS):
        assert {r.line for r in result.rows} == rows
        # The README's totals, on top of what this process had on the GPU before.
        mine = result.total_storage_bytes - start.total_storage_bytes
        assert f"{mine / 2**20:.1f}" == total
        shown = f"Total Tensor Used Memory:{result.total_storage_bytes / 2**20:<7.1f}Mb"
        assert shown in result.text()
    # The data keeps the allocator's blocks beside the storages' bytes.
    params = {r.shape: r for r in blocks[0].rows}
    assert (params["(64, 3, 3, 3)"].storage_bytes, params["(64, 3, 3, 3)"].bytes) == (6912, 7168)
    assert (params["(64,)"].storage_bytes, params["(64,)"].bytes) == (512, 1024)
    assert blocks[0].total_bytes - blocks[0].total_storage_bytes == (
        start.total_bytes - start.total_storage_bytes + 768
    )
    assert blocks[0].total_bytes == at_first[0], at_first[1]
    del cnn, d1, d2, d3, d4, d5
