"""The pytest plugin, run as users run it: an inner pytest in a fresh interpreter
(``pytester.runpytest_subprocess``) that finds the plugin through the installed wheel's
``pytest11`` entry point, with real torch tensors of known sizes."""

from __future__ import annotations

import json
import os

import pytest
import torch

import memlab_rs
from memlab_rs import PytestMemoryResult
from memlab_rs.integrations.pytest_plugin import file_name, parse_limit

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


def test_entry_point_is_installed_and_light():
    """pytest loads the plugin through the wheel's entry point, a module that imports
    neither memlab_rs nor torch (pytest loads it in every run of every project)."""
    from importlib.metadata import entry_points

    points = entry_points()
    # Python 3.9's entry_points() is a plain dict of groups; 3.10+ selects them.
    if hasattr(points, "select"):
        group = points.select(group="pytest11")
    else:
        group = points.get("pytest11", [])
    found = [e for e in group if e.name == "memlab_rs"]
    assert [e.value for e in found] == ["pytest_memlab_rs"]


# -- limit_memory: CPU tensors -------------------------------------------------------------

LIMITS = """
import pytest
import torch


@pytest.fixture
def held():
    return torch.empty(1_000_000)  # 4,000,000 bytes allocated before the call


@pytest.mark.limit_memory("2 MiB")
def test_fits():
    x = torch.empty(256, 1024)  # 1 MiB


@pytest.mark.limit_memory("512 KiB")
def test_over():
    x = torch.empty(256, 1024)  # the 1 MiB allocation
    del x


@pytest.mark.limit_memory(1_048_576)  # an int is bytes: exactly the peak passes
def test_exactly_at_the_limit(held):
    a = torch.empty(256, 1024)
    del a
    b = torch.empty(128, 1024)  # 512 KiB: the peak stays the 1 MiB before it


@pytest.mark.limit_memory("1048575")  # one byte less fails
def test_one_byte_over(held):
    a = torch.empty(256, 1024)


@pytest.mark.limit_memory("1 MB")
def test_fails_on_its_own():
    x = torch.empty(512, 1024)
    assert False, "the test's own failure"
"""


def test_limit_memory_passes_and_fails_with_exact_peak_and_line(pytester):
    pytester.makepyfile(test_limits=LIMITS)
    result = run(pytester, "-rA")
    result.assert_outcomes(passed=2, failed=3)
    out = result.stdout.str()
    over_line = line_of(LIMITS, "the 1 MiB allocation")
    result.stdout.fnmatch_lines(
        [
            "*_ test_over _*",
            "memlab_rs: CPU tensors peaked at 1,048,576 bytes (1.0 MiB) during the test's "
            "call, over the limit of 524,288 bytes (512.0 KiB) "
            "(@pytest.mark.limit_memory('512 KiB')) by 524,288 bytes (512.0 KiB)",
            "  peak = the highest allocated bytes during the call minus the * allocated when "
            "it began",
            "  allocated during the call and alive at its peak, by line (every location):",
            "        bytes  allocations  location",
            f"    1,048,576            1  test_limits.py:{over_line} (test_over)",
        ]
    )
    # one byte over: the fixture's 4,000,000 bytes, held before the call, are not counted
    result.stdout.fnmatch_lines(
        [
            "*_ test_one_byte_over _*",
            "memlab_rs: CPU tensors peaked at 1,048,576 bytes (1.0 MiB) during the test's "
            "call, over the limit of 1,048,575 bytes (1024.0 KiB) "
            "(@pytest.mark.limit_memory('1048575')) by 1 byte (1 B)",
        ]
    )
    # A test that fails by itself keeps its own failure.
    assert "AssertionError: the test's own failure" in out
    assert "limit_memory('1 MB')) by" not in out
    for outcome, test in [
        ("PASSED", "test_fits"),
        ("PASSED", "test_exactly_at_the_limit"),
        ("FAILED", "test_over - Failed: memlab_rs"),
        ("FAILED", "test_one_byte_over - Failed: memlab_rs"),
        ("FAILED", "test_fails_on_its_own - AssertionError"),
    ]:
        assert f"{outcome} test_limits.py::{test}" in out


def test_limit_memory_units(pytester):
    """The units parse exactly: 1 MiB fits 1.5 MiB, 1048576 B and 0.0009765625 GiB (exactly
    1 MiB), but not 1 MB (10**6 bytes)."""
    pytester.makepyfile(
        test_units="""
        import pytest
        import torch

        FITS = ["1.5MiB", "1048576 B", "1 mib", "0.0009765625 GiB"]

        @pytest.mark.parametrize(
            "limit", [pytest.param(f, marks=pytest.mark.limit_memory(f)) for f in FITS]
        )
        def test_fits(limit):
            x = torch.empty(256, 1024)

        @pytest.mark.limit_memory("1 MB")
        def test_decimal_megabyte():
            x = torch.empty(256, 1024)
        """
    )
    result = run(pytester, "-rA")
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(
        ["*over the limit of 1,000,000 bytes (976.6 KiB) (@pytest.mark.limit_memory('1 MB'))*"]
    )


def test_malformed_limits_fail_collection(pytester):
    pytester.makepyfile(
        test_bad="""
        import pytest

        RAN = []

        @pytest.mark.limit_memory("lots")
        def test_lots():
            RAN.append(1)

        @pytest.mark.limit_memory("-1 MB")
        def test_negative():
            pass

        @pytest.mark.limit_memory("")
        def test_empty():
            pass

        @pytest.mark.limit_memory(1.5)
        def test_float():
            pass

        @pytest.mark.limit_memory()
        def test_missing():
            pass

        @pytest.mark.limit_cuda_memory("1 GB", device="cpu")
        def test_cpu_device():
            pass

        @pytest.mark.limit_memory("1 GB")
        def test_fine():
            open("ran.txt", "w").close()
        """
    )
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    forms = "give a whole number of bytes (1048576) or a number and a unit: B, KB, MB"
    result.stderr.fnmatch_lines(
        [
            "ERROR: memlab_rs: malformed memory limits, so no test ran:",
            "  test_bad.py::test_lots: @pytest.mark.limit_memory('lots'): \"lots\" is not a "
            f"size: it does not start with a number; {forms}*",
            "  test_bad.py::test_negative: @pytest.mark.limit_memory('-1 MB'): \"-1 MB\" is not "
            f"a size: a size cannot be negative; {forms}*",
            "  test_bad.py::test_empty: @pytest.mark.limit_memory(''): \"\" is not a size: it is "
            f"empty; {forms}*",
            "  test_bad.py::test_float: @pytest.mark.limit_memory(1.5): a size must be a string "
            "or an int of bytes, not float (1.5); give*",
            "  test_bad.py::test_missing: @pytest.mark.limit_memory(): missing a required "
            "argument: 'limit'; write @pytest.mark.limit_memory(limit), e.g. "
            "@pytest.mark.limit_memory('512 MB')",
            "  test_bad.py::test_cpu_device: @pytest.mark.limit_cuda_memory('1 GB', "
            "device='cpu'): device='cpu' is not a CUDA device; limit CPU tensors with "
            "@pytest.mark.limit_memory",
        ]
    )
    assert "no tests ran" in result.stdout.str()
    assert not (pytester.path / "ran.txt").exists()


def test_memlab_save_on_a_file_is_a_usage_error_not_an_internal_error(pytester):
    """--memlab-save FILE on an existing file made os.makedirs raise FileExistsError inside
    pytest_configure: an INTERNALERROR traceback. Now it is a usage error naming the file."""
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    (pytester.path / "results.json").write_text("{}")
    result = run(pytester, "--memlab-save", "results.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --memlab-save results.json: that is a file, not a folder; give a folder*"]
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert (pytester.path / "results.json").read_text() == "{}"


def test_markers_are_registered(pytester):
    """--strict-markers accepts them, and --markers documents them."""
    pytester.makepyfile(
        test_strict="""
        import pytest

        @pytest.mark.limit_memory("1 GB")
        def test_a():
            pass
        """
    )
    run(pytester, "--strict-markers").assert_outcomes(passed=1)
    result = run(pytester, "--markers")
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.limit_memory(limit): fail the test if the CPU tensors its call "
            "allocates peak above limit*",
            "@pytest.mark.limit_cuda_memory(limit, device=None): fail the test if the CUDA "
            "memory its call allocates peaks above limit on device*",
        ]
    )


# -- off unless asked for ------------------------------------------------------------------


def test_does_nothing_without_options_or_markers(pytester):
    """Without an option or a marker, neither memlab_rs nor torch is imported and no CPU
    source is started; with a marker elsewhere, only the marked test's call is measured."""
    pytester.makepyfile(
        test_off="""
        import sys

        def test_nothing_imported():
            assert "memlab_rs" not in sys.modules
            assert "torch" not in sys.modules
            from memlab_rs import _core
            assert _core._cpu_mode() is None
        """
    )
    run(pytester).assert_outcomes(passed=1)
    pytester.makepyfile(
        test_off="""
        import pytest
        from memlab_rs import _core

        def test_before():
            assert _core._cpu_mode() is None

        @pytest.mark.limit_memory("1 GB")
        def test_marked():
            assert _core._cpu_mode() == "allocator"

        def test_after():
            assert _core._cpu_mode() is None
        """
    )
    run(pytester).assert_outcomes(passed=3)


def test_no_cuda_here_fails_the_cuda_limit(pytester):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the GPU tests check limit_cuda_memory")
    pytester.makepyfile(
        test_cuda_limit="""
        import pytest
        import torch

        @pytest.mark.limit_cuda_memory("1 GB")
        def test_needs_cuda():
            open("ran.txt", "w").close()

        @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
        @pytest.mark.limit_cuda_memory("1 GB")
        def test_skipped_without_cuda():
            pass
        """
    )
    result = run(pytester, "-rA")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "memlab_rs: test_cuda_limit.py::test_needs_cuda has "
            "@pytest.mark.limit_cuda_memory('1 GB'), but torch sees no CUDA device here, so "
            "the limit cannot be checked; skip it where there is no GPU*"
        ]
    )
    assert not (pytester.path / "ran.txt").exists()


# -- --memlab and --memlab-save ------------------------------------------------------------

SIZES = """
import pytest
import torch


def test_one_mib():
    x = torch.empty(256, 1024)


def test_two_mib():
    x = torch.empty(512, 1024)
    y = x.clone()  # 2 MiB more: the peak is 4 MiB


def test_half_mib():
    x = torch.empty(128, 1024)


@pytest.mark.limit_memory("3 MiB")
def test_limited():
    x = torch.empty(512, 1024)  # the limited 2 MiB


def test_nothing():
    pass
"""


def test_memlab_lists_the_highest_peaks(pytester):
    pytester.makepyfile(test_sizes=SIZES)
    result = run(pytester, "--memlab", "--memlab-top", "3")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(
        [
            "*= memlab_rs: the highest peaks of the tests' calls =*",
            "cpu: the 3 highest peaks of 5 tests measured",
            "  peak bytes           limit bytes  outcome  test",
            "   4,194,304  4.0 MiB            -  passed   test_sizes.py::test_two_mib",
            "   2,097,152  2.0 MiB    3,145,728  passed   test_sizes.py::test_limited",
            "   1,048,576  1.0 MiB            -  passed   test_sizes.py::test_one_mib",
            "peak: the highest allocated bytes during the call minus those allocated when it "
            "began*",
        ]
    )
    assert "test_half_mib" not in result.stdout.str()
    assert "--memlab-top 0: give a number of tests, 1 or more" in run(
        pytester, "--memlab", "--memlab-top", "0"
    ).stderr.str()


def test_memlab_save_writes_loadable_results(pytester):
    pytester.makepyfile(test_sizes=SIZES)
    result = run(pytester, "--memlab-save", "saved")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(["memlab_rs: saved 5 test result(s) in saved"])
    assert "highest peaks" not in result.stdout.str()  # the table is --memlab's
    folder = pytester.path / "saved"
    names = sorted(os.listdir(folder))
    assert names == sorted(
        f"test_sizes.py_{t}.json"
        for t in ["test_one_mib", "test_two_mib", "test_half_mib", "test_limited", "test_nothing"]
    )
    peaks = {}
    for name in names:
        loaded = memlab_rs.load(folder / name)
        assert isinstance(loaded, PytestMemoryResult)
        assert loaded.outcome == "passed" and loaded.devices[0] == "cpu"
        assert loaded.meta["device"] == "cpu" and loaded.meta["test"] == loaded.nodeid
        peaks[loaded.nodeid.split("::")[1]] = loaded.peak_bytes("cpu")
    assert peaks == {
        "test_one_mib": MIB,
        "test_two_mib": 4 * MIB,
        "test_half_mib": MIB // 2,
        "test_limited": 2 * MIB,
        "test_nothing": 0,
    }
    limited = memlab_rs.load(folder / "test_sizes.py_test_limited.json")
    m = limited.measurement("cpu")
    line = line_of(SIZES, "# the limited 2 MiB")
    assert m["limit_bytes"] == 3 * MIB
    assert m["rows"] == [
        {"location": f"test_sizes.py:{line} (test_limited)", "bytes": 2 * MIB, "count": 1}
    ]
    assert limited.text().splitlines()[:2] == [
        "test_sizes.py::test_limited: passed",
        "cpu: peak 2,097,152 bytes (2.0 MiB) above the "
        f"{m['start_bytes']:,} allocated when the call began; limit 3,145,728 bytes (3.0 MiB)",
    ]
    # no tracer without a limit: no rows
    assert memlab_rs.load(folder / "test_sizes.py_test_one_mib.json").measurement("cpu")[
        "rows"
    ] == []
    with open(folder / "test_sizes.py_test_limited.json") as f:
        document = json.load(f)
    assert document["kind"] == "test_memory"
    assert sorted(document["data"]) == ["measurements", "nodeid", "outcome"]


def test_saved_outcomes(pytester):
    pytester.makepyfile(
        test_outcomes="""
        import pytest
        import torch

        def test_fails():
            x = torch.empty(256, 1024)
            assert False

        @pytest.mark.xfail(strict=False)
        def test_xfails():
            assert False

        def test_skips():
            pytest.skip("not here")
        """
    )
    run(pytester, "--memlab-save", "saved").assert_outcomes(failed=1, xfailed=1, skipped=1)
    folder = pytester.path / "saved"
    outcomes = {
        r.nodeid.split("::")[1]: (r.outcome, r.peak_bytes("cpu"))
        for r in (memlab_rs.load(folder / n) for n in os.listdir(folder))
    }
    assert outcomes == {
        "test_fails": ("failed", MIB),
        "test_xfails": ("xfailed", 0),
        "test_skips": ("skipped", 0),
    }


def test_saved_where_asked_when_a_test_changes_directory(pytester):
    pytester.makepyfile(
        test_chdir="""
        import torch

        def test_moves(monkeypatch, tmp_path):
            monkeypatch.chdir(tmp_path)
            x = torch.empty(256, 1024)
        """
    )
    run(pytester, "--memlab-save", "saved").assert_outcomes(passed=1)
    loaded = memlab_rs.load(pytester.path / "saved" / "test_chdir.py_test_moves.json")
    assert loaded.peak_bytes("cpu") == MIB


def test_limit_checked_without_rows_when_a_cpu_trace_runs_already(pytester):
    """One CPU trace at a time: a fixture's trace leaves the plugin its counters, not rows."""
    pytester.makepyfile(
        test_traced="""
        import pytest
        import torch
        from memlab_rs import trace

        @pytest.fixture
        def tracing():
            with trace.Tracer(device="cpu") as tracer:
                yield tracer

        @pytest.mark.limit_memory("512 KiB")
        def test_over(tracing):
            x = torch.empty(256, 1024)
        """
    )
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "memlab_rs: CPU tensors peaked at 1,048,576 bytes (1.0 MiB) during the test's call*",
            "  peak = the highest allocated bytes during the call minus the * allocated when "
            "it began",
            "  note: no lines at the peak: a CPU trace is already running*",
        ]
    )


def test_a_peak_reset_by_the_test_is_reported(pytester):
    """A test that resets the allocator's peak (here a monitor's reader of the CPU source)
    after freeing what was there before: the peak is the one since, and the result says so."""
    pytester.makepyfile(
        test_reset="""
        import torch
        from memlab_rs import _core

        HELD = [torch.empty(1_000_000)]  # 4,000,000 bytes before the call

        def test_frees_then_resets():
            x = torch.empty(256, 1024)
            del x
            HELD.clear()
            _core.monitor.Source("cpu").read()  # reads, then resets the shared peak
        """
    )
    run(pytester, "--memlab-save", "saved").assert_outcomes(passed=1)
    loaded = memlab_rs.load(pytester.path / "saved" / "test_reset.py_test_frees_then_resets.json")
    m = loaded.measurement("cpu")
    assert m["peak_bytes"] == 0 and m["start_bytes"] >= 4_000_000
    assert m["notices"] == [
        "the allocator's peak was reset during the call (by the test, or a profiler it ran): "
        "the peak is the one since that reset"
    ]


# -- pieces ------------------------------------------------------------------------------


def test_file_names_from_node_ids():
    assert file_name("tests/test_a.py::TestX::test_b[1-cuda:0]") == (
        "tests_test_a.py_TestX_test_b_1-cuda_0.json"
    )
    long_a, long_b = "t.py::test_" + "a" * 200 + "[1]", "t.py::test_" + "a" * 200 + "[2]"
    assert len(file_name(long_a)) == 120 + 1 + 12 + 5
    assert file_name(long_a) != file_name(long_b)


def test_parse_limit():
    limit = parse_limit(pytest.mark.limit_cuda_memory("1.5GiB", device=1).mark)
    assert (limit.limit_bytes, limit.device, limit.written) == (
        1_610_612_736,
        1,
        "limit_cuda_memory('1.5GiB', device=1)",
    )
    assert parse_limit(pytest.mark.limit_memory(limit="512 MB").mark).limit_bytes == 512_000_000
    with pytest.raises(ValueError, match=r"limit_memory\('1 GB', 2\): too many positional"):
        parse_limit(pytest.mark.limit_memory("1 GB", 2).mark)
    with pytest.raises(ValueError, match=r"device='npu' is not a device"):
        parse_limit(pytest.mark.limit_cuda_memory("1 GB", device="npu").mark)


def test_result_round_trip(tmp_path):
    result = PytestMemoryResult(
        "t.py::test_a",
        "failed",
        [
            {
                "device": "cuda:0",
                "peak_bytes": 3 * MIB,
                "start_bytes": 512,
                "limit_bytes": 2 * MIB,
                "rows": [{"location": "t.py:3 (test_a)", "bytes": 3 * MIB, "count": 2}],
                "notices": [],
            }
        ],
        meta=memlab_rs.results.run_meta("cuda:0"),
    )
    result.save(tmp_path / "r.json.gz")
    loaded = memlab_rs.load(tmp_path / "r.json.gz")
    assert loaded.to_data() == result.to_data()
    assert loaded.text() == (
        "t.py::test_a: failed\n"
        "cuda:0: peak 3,145,728 bytes (3.0 MiB) above the 512 allocated when the call began; "
        "limit 2,097,152 bytes (2.0 MiB): exceeded\n"
        "  allocated during the call and alive at its peak, by line (every location):\n"
        "        bytes  allocations  location\n"
        "    3,145,728            2  t.py:3 (test_a)\n"
    )
    with pytest.raises(ValueError, match=r"t.py::test_a was not measured on 'cpu' \(measured: "):
        loaded.measurement("cpu")


# -- limit_leaks: memory that grows when the body runs again ---------------------------------

LEAKS = """
import pytest
import torch

KEPT = []


@pytest.fixture
def cache():
    return {}


@pytest.mark.limit_leaks("1 KB", calls=4, device="cpu")
def test_leaks_2000_bytes_a_call():
    KEPT.append(torch.empty(2000, dtype=torch.uint8))  # the leak
    torch.ones(1000).sum()


@pytest.mark.limit_leaks("1 KB", calls=4, device="cpu")
def test_leaks_under_the_limit():
    KEPT.append(torch.empty(100, dtype=torch.uint8))


@pytest.mark.limit_leaks(0, calls=3, warmup=2, device="cpu")
def test_steady_with_a_fixture(cache):
    cache["last"] = torch.randn(4096)  # replaced each call: steady
    assert cache["last"].numel() == 4096


@pytest.mark.limit_leaks(0)
def test_fails_on_its_own():
    assert False, "the test's own failure"
"""


def test_limit_leaks_fails_a_growing_body_with_its_line_and_passes_steady_ones(pytester):
    pytester.makepyfile(test_leaks=LEAKS)
    result = run(pytester, "-rA")
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    line = line_of(LEAKS, "# the leak")
    result.stdout.fnmatch_lines(
        [
            "*_ test_leaks_2000_bytes_a_call _*",
            "memlab_rs: memory grew by more than 1,000 bytes per call over 4 calls (after 1 "
            "warm-up call), @pytest.mark.limit_leaks('1 KB', calls=4, device='cpu'):",
            "cpu:",
            f"  +2,000 bytes/step  test_leaks.py:{line} (test_leaks_2000_bytes_a_call)",
            "      live at each step's end: *; 5 allocations alive at the end",
        ]
    )
    assert "AssertionError: the test's own failure" in out
    for outcome, test in [
        ("FAILED", "test_leaks_2000_bytes_a_call - Failed: memlab_rs"),
        ("PASSED", "test_leaks_under_the_limit"),
        ("PASSED", "test_steady_with_a_fixture"),
        ("FAILED", "test_fails_on_its_own - AssertionError"),
    ]:
        assert f"{outcome} test_leaks.py::{test}" in out
