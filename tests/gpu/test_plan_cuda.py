"""memlab_rs.plan's answers run for real on the GPU (bench/plan_check.py): for each row of
the plans of an MLP, the bundled TinyGPT and ResNet-18 (its cuDNN workspaces measured by the
estimate's kernel probe), the largest size the plan says fits its budget fits in real steps
(max_memory_reserved) and one size more does not; and with no budget a plan on a GPU takes
what this process could have now."""

from __future__ import annotations

import pytest
import torch
from bench_modules import bench_module

import memlab_rs

pytestmark = pytest.mark.cuda

bench = bench_module("plan_check")


@pytest.mark.parametrize("name", ["mlp", "tinygpt", "resnet18"])
def test_each_rows_answer_fits_and_one_more_does_not(name):
    (workload,) = [w for w in bench.WORKLOADS if w.name == name]
    lines: list[str] = []
    verdicts = bench.check(workload, lines.append)
    print("\n".join(lines))
    assert len(verdicts) >= 4 and all(verdicts), "\n".join(lines)


def test_without_a_budget_the_plan_takes_what_the_process_could_have():
    free, _total = torch.cuda.mem_get_info()
    p = memlab_rs.plan(torch.nn.Linear(64, 64), lambda n: torch.zeros(n, 64), 8,
                       sizes=[], precisions=[], optimizers={}, try_checkpointing=False,
                       search=False)  # fmt: skip
    budget = free + torch.cuda.memory_reserved()
    assert abs(p.budget - budget) <= 64 << 20, (p.budget, budget)
    assert "free memory and torch's reserved" in p.text()
