"""The %mlrun / %%mlrun magics, driven through a real IPython shell, every flag."""

from __future__ import annotations

import pytest

pytest.importorskip("IPython")

import torch  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

import memlab_rs  # noqa: E402

MiB = 1 << 20


@pytest.fixture(scope="module")
def shell():
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "memlab_rs")
    ok = sh.run_cell(
        "import torch\n"
        "def make(n):\n"
        "    a = torch.empty(n, 1024)\n"
        "    return a\n"
    )
    assert ok.success
    return sh


def run(shell, source):
    result = shell.run_cell(source)
    if result.error_before_exec or result.error_in_exec:
        raise result.error_before_exec or result.error_in_exec
    return result.result


def allocated(shown, code):
    row = next(r for r in shown.records() if r["code"].strip() == code)
    return row["allocated_bytes.all.allocated"]


def test_line_magic_runs_a_statement_with_spaces_and_quotes_as_typed(shell):
    shown = run(
        shell,
        "%mlrun -d cpu -f make -c allocated_bytes.all.allocated "
        "x = make(256  +  len('a  b') - 4)",
    )
    assert isinstance(shown, memlab_rs.LineRecordsDisplay)
    assert shell.user_ns["x"].shape == (256, 1024)
    assert allocated(shown, "a = torch.empty(n, 1024)") == MiB
    assert shown.columns == [
        "active_bytes.all.peak",
        "reserved_bytes.all.peak",
        "allocated_bytes.all.allocated",
    ]


def test_cell_magic_profiles_a_function_the_cell_defines(shell):
    shown = run(
        shell,
        "%%mlrun -d cpu -f fresh -f Net.forward -D -c allocated_bytes.all.allocated\n"
        "def fresh():\n"
        "    t = torch.empty(512, 1024)\n"
        "    return t\n"
        "class Net(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x + x\n"
        "y = fresh()\n"
        "z = Net()(torch.ones(256, 1024))\n",
    )
    assert shown.columns == ["allocated_bytes.all.allocated"]
    assert allocated(shown, "t = torch.empty(512, 1024)") == 2 * MiB
    assert allocated(shown, "return x + x") == MiB
    assert "## fresh" in str(shown) and "## Net.forward" in str(shown)


def test_return_profiler(shell):
    gpu = 1 if torch.cuda.device_count() > 1 else 0
    lp = run(shell, f"%mlrun -r -d cpu -g {gpu} -f make make(1)")
    assert isinstance(lp, memlab_rs.LineProfiler)
    assert lp.target_gpu == gpu and lp.device == "cpu"
    assert allocated(lp.display(columns=["allocated_bytes.all.allocated"]),
                     "a = torch.empty(n, 1024)") == 4096


def test_quiet_shows_nothing(shell):
    assert run(shell, "%mlrun -q -d cpu -f make make(1)") is None


def test_dump_writes_the_columns_shown(shell, tmp_path):
    target = tmp_path / "profile.txt"
    shown = run(
        shell,
        f"%mlrun -d cpu -D -c allocated_bytes.all.allocated -c allocated_bytes.all.freed "
        f"-T {target} -f make make(256)",
    )
    text = target.read_text()
    assert text == str(shown)
    assert text.splitlines()[2].split()[:2] == ["allocated_bytes", "line"]
    assert "freed" in text and "reserved_bytes" not in text


def test_gpu_option_picks_the_device_when_cuda_is_used(shell):
    from IPython.core.error import UsageError

    if torch_cuda_available():
        lp = run(shell, "%mlrun -r -g 0 -d cuda -f make make(1)")
        assert lp.device == "cuda:0"
    with pytest.raises(UsageError, match="cuda:99"):
        run(shell, "%mlrun -r -g 99 -d cuda -f make make(1)")
    # a GPU that does not exist fails before the statement runs, whatever the device
    shell.user_ns.pop("ran", None)
    with pytest.raises(UsageError, match="target_gpu=5") as err:
        run(shell, "%mlrun -g 5 -f make ran = make(1)")
    assert "ran" not in shell.user_ns
    if not torch_cuda_available():
        assert "CUDA is not available on this machine" in str(err.value)


def test_a_column_that_does_not_exist_fails_before_the_statement_runs(shell):
    from IPython.core.error import UsageError

    shell.user_ns.pop("ran", None)
    with pytest.raises(UsageError, match="unknown column 'bogus'"):
        run(shell, "%mlrun -d cpu -f make -c bogus ran = make(1)")
    assert "ran" not in shell.user_ns
    with pytest.raises(UsageError, match="did you mean 'allocated_bytes.all.peak'"):
        run(shell, "%%mlrun -d cpu -f make -c allocated_bytes.all.peek\nran = make(1)")
    assert "ran" not in shell.user_ns


def torch_cuda_available():
    import torch

    return torch.cuda.is_available()


def test_usage_errors_say_what_is_wrong(shell):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="could not find function 'nope'"):
        run(shell, "%mlrun -d cpu -f nope make(1)")
    with pytest.raises(UsageError, match="name the functions"):
        run(shell, "%mlrun make(1)")
    with pytest.raises(UsageError, match="nothing to run"):
        run(shell, "%mlrun -f make")
    with pytest.raises(UsageError, match="-D hides the default columns"):
        run(shell, "%mlrun -D -d cpu -f make make(1)")
    with pytest.raises(UsageError, match="not valid Python"):
        run(shell, "%mlrun -d cpu -f make make(1")


def test_help_lists_every_flag(shell):
    doc = memlab_rs.integrations.ipython.MemlabMagics.mlrun.__doc__
    for flag in ("--function", "--column", "--no_default_columns", "--return-profiler",
                 "--gpu", "--quiet", "--dump-profile", "--device"):
        assert flag in doc
