"""`memlab-rs estimate MODULE:FACTORY`: the plan of the model the user's factory builds,
the same table `memlab_rs.plan` renders for the same settings, saved for `show`; a factory
that is missing or returns the wrong thing is one line of error."""

from __future__ import annotations

from pathlib import Path

import torch
from cli_in_process import cli_in_process, one_line_error

import memlab_rs
from memlab_rs.cli.estimate import PARALLEL_MODES as CLI_PARALLEL_MODES
from memlab_rs.cli.estimate import PRECISIONS as CLI_PRECISIONS
from memlab_rs.estimation._data_parallel import MODES as PARALLEL_MODES
from memlab_rs.estimation.what_if import PRECISIONS

FACTORY = """
import torch

def make():
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(3)]
    return {"model": torch.nn.Sequential(*blocks), "make_inputs": lambda n: torch.zeros(n, 64),
            "size": 16}

def pair():
    return torch.nn.Linear(8, 8), lambda n: torch.zeros(n, 8)

def wrong():
    return 3

def convs():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten())
    return model, lambda n: torch.zeros(n, 3, 8, 8)
"""


def _blocks() -> torch.nn.Module:
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(3)]
    return torch.nn.Sequential(*blocks)


def test_the_table_is_the_plans_and_it_is_saved(tmp_path: Path):
    (tmp_path / "workloads.py").write_text(FACTORY)
    saved = tmp_path / "plan.json"
    proc = cli_in_process(
        "estimate", "workloads:make", "--device", "cpu", "--budget", "2MiB",
        "--optimizers", "sgd-momentum", "--precisions", "bf16", "--save", str(saved),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    expected = memlab_rs.plan(
        _blocks(), lambda n: torch.zeros(n, 64), 16, "2MiB", device="cpu",
        precisions=["bf16"],
        optimizers={"sgd-momentum": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9)},
    )  # fmt: skip
    assert proc.stdout == expected.text()
    assert memlab_rs.load(saved).text() == proc.stdout


def test_a_file_path_and_a_pair_work_too(tmp_path: Path):
    (tmp_path / "workloads.py").write_text(FACTORY)
    proc = cli_in_process(
        "estimate", "workloads.py:pair", "--device", "cpu", "--no-search", "--sizes",
        "--precisions", "--optimizers", "--no-checkpointing-row", "--format", "json",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert '"axis": "baseline"' in proc.stdout and '"size": 8' in proc.stdout


def test_bad_factories_are_one_line(tmp_path: Path):
    (tmp_path / "workloads.py").write_text(FACTORY)

    def error(spec: str) -> str:
        return one_line_error(cli_in_process("estimate", spec, "--device", "cpu", cwd=tmp_path),
                              "estimate")  # fmt: skip

    assert "give the factory as module:function" in error("workloads")
    assert "no module named 'nowhere'" in error("nowhere:make")
    assert "has no function 'missing'" in error("workloads:missing")
    assert "must return (model, make_inputs)" in error("workloads:wrong")
    assert "no such file" in error("gone.py:make")


def test_the_precisions_and_modes_offered_are_the_plans():
    assert tuple(PRECISIONS) == CLI_PRECISIONS
    assert PARALLEL_MODES == CLI_PARALLEL_MODES


def test_per_rank_plans_take_the_world_size_and_mode(tmp_path: Path):
    (tmp_path / "workloads.py").write_text(FACTORY)
    proc = cli_in_process(
        "estimate", "workloads:make", "--device", "cpu", "--budget", "2MiB",
        "--precisions", "--optimizers", "--no-checkpointing-row", "--world-size", "2",
        "--parallel", "ddp", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    expected = memlab_rs.plan(
        _blocks(), lambda n: torch.zeros(n, 64), 16, "2MiB", device="cpu", precisions=[],
        optimizers={}, try_checkpointing=False, world_size=2, parallel="ddp",
    )  # fmt: skip
    assert proc.stdout == expected.text()
    assert [r["parallel"] for r in expected.rows][-1] == "fsdp2"
    refused = cli_in_process(
        "estimate", "workloads:make", "--device", "cpu", "--world-size", "2", cwd=tmp_path
    )
    assert "world_size=2 needs a data-parallel mode" in one_line_error(refused, "estimate")


def test_no_measure_kernels_is_the_plans_measure_kernels_false(tmp_path: Path):
    (tmp_path / "workloads.py").write_text(FACTORY)
    proc = cli_in_process(
        "estimate", "workloads:convs", "--device", "cpu", "--budget", "1MiB", "--sizes",
        "--precisions", "--optimizers", "--no-checkpointing-row", "--no-measure-kernels",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten())
    expected = memlab_rs.plan(
        model, lambda n: torch.zeros(n, 3, 8, 8), 8, "1MiB", device="cpu", sizes=[],
        precisions=[], optimizers={}, try_checkpointing=False, measure_kernels=False,
    )  # fmt: skip
    assert proc.stdout == expected.text()
