"""Courtesy regions on the GPU (issue 23's done-when, run as region_scenario.py in a process
of its own): pause gives back all of the region's physical memory (the driver's used memory
drops by the region's size within 2 MiB) and another region and another process can use it;
resume brings every tensor back bitwise at the same address, a CUDA graph replays to the same
output and training goes on with the losses of a run never paused; nothing of ours stays
after the regions close. Also: a region asked for on a device that does not exist."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from memlab_rs import Courtesy

pytestmark = pytest.mark.cuda

MiB = 1 << 20
SCENARIO = Path(__file__).with_name("region_scenario.py")


@pytest.fixture(scope="module")
def story():
    pytest.importorskip("transformers")
    run = subprocess.run(
        [sys.executable, str(SCENARIO), "12"], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    print(json.dumps(out, indent=1))
    return out


def test_pause_gives_back_all_of_the_regions_memory(story):
    pause = story["pause"]
    assert pause["region_bytes"] == story["region_bytes"] > story["state_bytes"]
    assert abs(pause["dropped"] - story["region_bytes"]) <= 2 * MiB, pause
    assert pause["moved"] >= story["state_bytes"]
    assert pause["pin_seconds"] == 0.0  # the host buffers were pinned ahead
    # While paused, the tensor report says why the driver shows less than torch reserves.
    (line,) = story["report_while_paused"]
    assert "of it in paused Courtesy regions, with no device memory behind it" in line, line


def test_while_paused_another_region_and_another_process_use_the_memory(story):
    assert story["free_when_full"] < 512 * MiB
    assert story["other_region_took"] == story["region_bytes"] - 64 * MiB, story
    assert story["other_process"]["rc"] == 0, story["other_process"]
    assert story["other_process"]["out"] == "1"


def test_resume_brings_every_tensor_back_bitwise_at_the_same_address(story):
    resume = story["resume"]
    assert resume["region_bytes"] == story["region_bytes"]
    assert abs(resume["grew"] - story["region_bytes"]) <= 2 * MiB, resume
    assert story["tensors_checked"] > 100
    assert story["addresses_same"] and story["bitwise_equal"]
    assert story["graph_same"]


def test_training_goes_on_with_the_losses_of_a_run_never_paused(story):
    assert story["losses"] == story["reference_losses"]


def test_nothing_of_ours_stays_after_the_regions_close(story):
    # After close only what torch itself still holds stays booked: the cuBLAS workspace it
    # made for the capture's stream, in the graphs region's pool; cleared, nothing is left.
    assert {e["tag"] for e in story["state_after_close"]} <= {"graphs"}
    assert story["state_after_clearing_cublas"] == []
    assert story["counters"][2] == 0  # no free of an address we never gave out
    assert story["pin_threads"] == []
    assert story["new_allocation_ours"] is None


def test_a_region_on_a_device_that_does_not_exist_is_refused():
    count = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"there is no cuda:{count}"):
        Courtesy.region("elsewhere", device=count)


def test_regions_on_a_second_gpu_pause_and_resume_there():
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU here: the two-GPU machine runs this")
    region = Courtesy.region("second", device=1)
    with region:
        x = torch.arange(1 << 20, device="cuda:1", dtype=torch.float32)
    address = x.data_ptr()
    used_before = torch.cuda.mem_get_info(1)
    report = Courtesy.pause("second")
    assert report.per_device == {"cuda:1": region.state()["paused_bytes"]}
    assert torch.cuda.mem_get_info(1)[0] > used_before[0]
    Courtesy.resume("second")
    assert x.data_ptr() == address
    assert torch.equal(x.cpu(), torch.arange(1 << 20, dtype=torch.float32))
    del x
    region.close()
