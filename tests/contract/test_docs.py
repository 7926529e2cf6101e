"""The API reference is generated from the docstrings: it must be up to date."""

from __future__ import annotations

import importlib.util
import re

import pytest
from paths import ROOT

pytest.importorskip("IPython")

DOCS = ROOT / "docs"


def test_api_reference_is_up_to_date():
    spec = importlib.util.spec_from_file_location("gen_api", DOCS / "gen_api.py")
    gen_api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_api)
    assert (DOCS / "api.md").read_text() == gen_api.render(), "run: python docs/gen_api.py"


def test_every_public_name_is_in_the_reference():
    import memlab_rs

    text = (DOCS / "api.md").read_text()
    for name in memlab_rs.__all__:
        assert f"memlab_rs.{name}" in text


# -- what the docs quote is what the code prints ---------------------------------------------

pytest_plugins = ["pytester"]


def blocks_after(text: str, heading: str) -> list[tuple[str, str]]:
    """The fenced blocks (language, body) of the section under ``heading``, in order."""
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w*)\n(.*?)```", section, re.S)


def consecutive(lines: list[str], wanted: list[str]) -> bool:
    """Whether ``wanted`` appears in ``lines`` as a run of whole lines."""
    return any(lines[i : i + len(wanted)] == wanted for i in range(len(lines)))


def test_the_pytest_examples_print_what_the_readme_and_the_guide_quote(pytester):
    """The README and the guide show a test file and what pytest prints for it: both are
    run here (the guide's file extends the README's, so one run checks both)."""
    readme = blocks_after((ROOT / "README.md").read_text(), "## pytest plugin")
    guide_text = (DOCS / "guide.md").read_text()
    guide = blocks_after(guide_text, "## pytest plugin")
    readme_code, readme_failure = readme[0][1], readme[1][1]
    guide_code = guide[0][1]
    guide_failure = next(b for _, b in guide if b.startswith("memlab_rs: CPU tensors peaked"))
    guide_table = next(b for _, b in guide if "memlab_rs: the highest peaks" in b)
    assert readme[0][0] == guide[0][0] == "python"
    assert guide_code.startswith(readme_code), "the guide's test file extends the README's"
    assert readme_failure == guide_failure
    pytester.makepyfile(test_model=guide_code)
    chosen = re.search(r'`pytest --memlab -k "([^"]+)" test_model.py`', guide_text).group(1)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--memlab", "-k", chosen)
    lines = result.stdout.lines
    assert consecutive(lines, guide_failure.splitlines()), result.stdout.str()
    assert consecutive(lines, guide_table.splitlines()), result.stdout.str()


def test_the_guide_sizes_table_is_what_parse_size_reads():
    from memlab_rs import parse_size

    section = (DOCS / "guide.md").read_text().split("### Sizes", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| (`.*?`) \| ([\d,]+)", section, re.M)
    assert len(rows) >= 8
    for written, expected in rows:
        for form in re.findall(r"`([^`]+)`", written):
            size = int(form) if form.isdigit() else form.strip('"')
            assert parse_size(size) == int(expected.replace(",", "")), form


def test_the_guide_quotes_the_error_of_a_malformed_limit():
    from memlab_rs.integrations.pytest_plugin import parse_limit

    section = (DOCS / "guide.md").read_text().split("### Sizes", 1)[1].split("\n### ", 1)[0]
    quoted = section.split("```\n", 1)[1].split("```", 1)[0].splitlines()
    assert quoted[0] == "ERROR: memlab_rs: malformed memory limits, so no test ran:"
    with pytest.raises(ValueError) as raised:
        parse_limit(pytest.mark.limit_memory("lots").mark)
    assert quoted[1] == f"  test_bad.py::test_lots: {raised.value}"


def quoted_readers() -> set[str]:
    import memlab_rs

    return set(re.findall(r'``"([^"]+)"``', memlab_rs.LineProfiler.stats_reader.__doc__))


def test_stats_reader_documents_the_cpu_readers_it_reports(monkeypatch):
    """docs/api.md said the CPU reader was "storage counts"; it is "allocator hook", or
    "dispatch mode" where the hook cannot be used. The reference is generated from this
    docstring (test_api_reference_is_up_to_date)."""
    import memlab_rs
    from memlab_rs._sources import cpu_source as _cpu_source

    seen = set()
    with memlab_rs.LineProfiler(device="cpu") as profiler:
        seen.add(profiler.stats_reader)
    monkeypatch.setattr(_cpu_source, "probe", lambda: False)  # the fallback, as its test does
    with memlab_rs.LineProfiler(device="cpu") as profiler:
        seen.add(profiler.stats_reader)
    assert seen == {"allocator hook", "dispatch mode"}
    cuda = {"allocator memory", "torch._C._cuda_memoryStats"}  # test_line_profiler_cuda's
    assert quoted_readers() == seen | cuda


@pytest.mark.cuda
def test_stats_reader_documents_the_cuda_readers_it_reports(monkeypatch):
    import torch

    import memlab_rs

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    seen = set()
    for forced in (None, "binding"):
        if forced:
            monkeypatch.setenv("MEMLAB_RS_CUDA_STATS", forced)
        with memlab_rs.LineProfiler(device="cuda:0") as profiler:
            torch.ones(1, device="cuda:0")
            seen.add(profiler.stats_reader)
    assert "torch._C._cuda_memoryStats" in seen and seen <= quoted_readers()


def test_the_guide_leak_check_example_prints_what_the_guide_quotes():
    """The guide's leak check example, run in-process as ``train.py`` (its sites read
    ``train.py:N``), prints the output the guide quotes; without its two ``append`` lines,
    nothing grows."""
    import contextlib
    import io

    blocks = blocks_after((DOCS / "guide.md").read_text(), "## leaks: memory that grows")
    code, printed = blocks[0][1], blocks[1][1]
    for source, expected in [
        (code, printed),
        ("".join(line for line in code.splitlines(True) if ".append(" not in line), None),
    ]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(source, "train.py", "exec"), {"__name__": "train"})
        if expected is not None:
            assert out.getvalue() == expected + "\n"
        else:
            assert "no site grew at every step" in out.getvalue()
