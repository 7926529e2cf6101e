"""Every example in the public docstrings runs and prints what it says."""

import doctest
import importlib

import pytest


@pytest.mark.parametrize(
    "module",
    [
        "memlab_rs.reporter",
        "memlab_rs.models",
        "memlab_rs._core",
        "memlab_rs._trace_plots",
        "memlab_rs._memory_viz_export",
        "memlab_rs.trace",
        "memlab_rs._trace_tags",
        "memlab_rs.estimate",
        "memlab_rs.results",
        "memlab_rs.line_result",
        "memlab_rs.tracker",
        "memlab_rs.monitor_result",
        "memlab_rs._trace_saved",
        "memlab_rs._backward_calls",
        "memlab_rs._module_hooks",
        "memlab_rs.merge",
        "memlab_rs.diff",
        "memlab_rs.cli",
        "memlab_rs._line_targets",
        "memlab_rs._runner",
        "memlab_rs._profiled_run",
        "memlab_rs.pytest_plugin",
        "memlab_rs.pytest_result",
    ],
)
def test_docstring_examples(module):
    mod = importlib.import_module(module)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = finder.find(mod, mod.__name__)
    if module == "memlab_rs._core":  # a native module: read the docstrings of its members
        tests = [
            t
            for name in dir(mod)
            for t in finder.find(getattr(mod, name), f"{module}.{name}")
            if getattr(getattr(mod, name), "__doc__", None)
        ]
    assert tests, f"no examples found in {module}"
    for test in tests:
        runner.run(test)
    assert runner.failures == 0
