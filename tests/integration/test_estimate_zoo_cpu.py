"""The validation zoo's CPU rows in CI (``bench/estimate_zoo.py --device cpu``): the estimate
against real CPU steps of the zoo's own plain VGG-like conv stack, which needs nothing but
torch. Its convolutions' oneDNN scratch made it 8-15% short before it was measured on the
device; now within 3% on both steps (the whole quick CPU zoo, with torchvision and
transformers, is in bench/results)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from paths import ROOT

from memlab_rs._sources import cpu_source

pytestmark = pytest.mark.skipif(
    cpu_source.library() is None, reason="this torch has no libc10.so: no CPU source to compare"
)

sys.path.insert(0, str(ROOT / "bench"))
_spec = importlib.util.spec_from_file_location("estimate_zoo", ROOT / "bench" / "estimate_zoo.py")
zoo_bench = importlib.util.module_from_spec(_spec)
sys.modules["estimate_zoo"] = zoo_bench  # its dataclasses look their module up there
_spec.loader.exec_module(zoo_bench)


# fp32 only: its bf16 rows take 80 s each on a CPU without bf16 instructions (they are in
# the committed zoo run, and test_kernel_probe's random conv nets run bf16 at small sizes).
def test_the_plain_conv_stack_is_within_3_percent_of_real_cpu_steps():
    (row,) = [r for r in zoo_bench.zoo.rows("cpu") if r.name == "plain_vgg fp32 sgd-foreach"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the zoo runs on the CPU (the probe's worker gets it too)
    try:
        outcome = zoo_bench.run_row(row, row.workload.build(), "cpu", zoo_bench.CpuMeter(),
                                    real=True)  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert outcome.est is not None, outcome.est_error
    assert outcome.real is not None, outcome.real_error
    first, steady = outcome.errors()
    assert abs(first) < 0.03 and abs(steady) < 0.03, zoo_bench.line(outcome)
    assert any("oneDNN scratch measured on this CPU" in n for n in outcome.est.notes)
