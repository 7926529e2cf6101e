"""The pytest plugin's CUDA side (run on the GPU machine): limit_cuda_memory and --memlab's
cuda:N table, through an inner pytest in a fresh interpreter as users run it (the CPU side is
tests/integration/test_pytest_plugin.py)."""

from __future__ import annotations

import pytest

import memlab_rs

pytest_plugins = ["pytester"]

MIB = 1 << 20


def line_of(source: str, text: str) -> int:
    """The line number of the first line of ``source`` containing ``text``, in the file
    ``makepyfile`` writes (without the leading blank lines)."""
    lines = source.strip("\n").splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def run(pytester, *args):
    # -p no:cacheprovider: nothing written beside the tests; -rA: every outcome listed
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


CUDA_LIMITS = """
import pytest
import torch


@pytest.mark.limit_cuda_memory("2 MiB")
def test_fits():
    x = torch.empty(256, 1024, device="cuda")  # 1 MiB


@pytest.mark.limit_cuda_memory("512 KiB", device=0)
def test_over():
    x = torch.empty(256, 1024, device="cuda")  # the 1 MiB allocation
    y = torch.empty(64, 1024, device="cuda")  # 256 KiB


@pytest.mark.limit_cuda_memory(2 * 1024 * 1024)
def test_reuses_the_cache():
    # 1 MiB cached by an earlier test and held before the call are not the call's
    x = torch.empty(512, 1024, device="cuda")  # 2 MiB: exactly the limit
"""


@pytest.mark.cuda
def test_limit_cuda_memory(pytester):
    pytester.makepyfile(test_cuda_limits=CUDA_LIMITS)
    result = run(pytester, "-rA")
    result.assert_outcomes(passed=2, failed=1)
    big, small = line_of(CUDA_LIMITS, "the 1 MiB allocation"), line_of(CUDA_LIMITS, "256 KiB")
    result.stdout.fnmatch_lines(
        [
            "memlab_rs: cuda:0 peaked at 1,310,720 bytes (*) during the test's call, over "
            "the limit of 524,288 bytes (512.0 KiB) "
            "(@pytest.mark.limit_cuda_memory('512 KiB', device=0)) by 786,432 bytes (*)",
            "*",
            "  allocated during the call and alive at its peak, by line (every location):",
            "        bytes  allocations  location",
            f"    1,048,576            1  test_cuda_limits.py:{big} (test_over)",
            f"      262,144            1  test_cuda_limits.py:{small} (test_over)",
        ]
    )


@pytest.mark.cuda
def test_memlab_measures_cuda(pytester):
    pytester.makepyfile(
        test_cuda_sizes="""
        import torch

        def test_cpu_only():
            x = torch.empty(256, 1024)

        def test_cuda():
            x = torch.empty(512, 1024, device="cuda")
            y = torch.empty(256, 1024)
        """
    )
    result = run(pytester, "--memlab", "--memlab-save", "saved")
    result.assert_outcomes(passed=2)
    # (the CPU table is not checked here: initialising CUDA may allocate CPU tensors)
    result.stdout.fnmatch_lines(
        [
            "cuda:0: the 1 highest peaks of 1 test measured",
            "  peak bytes           limit bytes  outcome  test",
            "   2,097,152  2.0 MiB            -  passed   test_cuda_sizes.py::test_cuda",
        ]
    )
    saved = memlab_rs.load(pytester.path / "saved" / "test_cuda_sizes.py_test_cuda.json")
    assert (saved.devices, saved.peak_bytes("cuda:0")) == (["cpu", "cuda:0"], 2 * MIB)
