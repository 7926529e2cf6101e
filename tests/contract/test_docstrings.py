"""Every example in the public docstrings runs and prints what it says."""

import doctest
import importlib

import pytest


@pytest.mark.parametrize(
    "module",
    [
        "memlab_rs.tensor_report.reporter",
        "memlab_rs.tensor_report.result",
        "memlab_rs.tensor_report.merged",
        "memlab_rs.tensor_report.diff",
        "memlab_rs.models",
        "memlab_rs._core",
        "memlab_rs._core.tensor_report",
        "memlab_rs._core.tracker",
        "memlab_rs.trace",
        "memlab_rs.trace.plots",
        "memlab_rs.trace.memory_viz",
        "memlab_rs.trace.result",
        "memlab_rs.trace.tracer",
        "memlab_rs.trace.files",
        "memlab_rs.trace.options",
        "memlab_rs.trace.timeline",
        "memlab_rs.trace.tags",
        "memlab_rs.trace.names",
        "memlab_rs.estimation.estimator",
        "memlab_rs.estimation.result",
        "memlab_rs.estimation.search",
        "memlab_rs.results",
        "memlab_rs.line_profiler.columns",
        "memlab_rs.line_profiler.code",
        "memlab_rs.line_profiler.view",
        "memlab_rs.line_profiler.display",
        "memlab_rs.line_profiler.result",
        "memlab_rs.line_profiler.profiler",
        "memlab_rs.line_profiler.merged",
        "memlab_rs.line_profiler.diff",
        "memlab_rs.tracker.result",
        "memlab_rs.tracker.track",
        "memlab_rs.monitor.result",
        "memlab_rs.monitor.memory_monitor",
        "memlab_rs.trace.saved",
        "memlab_rs.monitor._backward_calls",
        "memlab_rs.courtesy.moves",
        "memlab_rs.courtesy.reports",
        "memlab_rs.courtesy.preemption",
        "memlab_rs._module_hooks",
        "memlab_rs.results.diff",
        "memlab_rs.results.merge",
        "memlab_rs.cli.main",
        "memlab_rs.cli._arguments",
        "memlab_rs.cli.run",
        "memlab_rs.line_profiler.targets",
        "memlab_rs.cli._runner",
        "memlab_rs.cli._profiled_run",
        "memlab_rs.integrations.pytest_plugin",
        "memlab_rs.test_memory.result",
        "memlab_rs.doctor.allocator_fragmentation",
        "memlab_rs.doctor.growth",
        "memlab_rs.doctor.leak_result",
        "memlab_rs._args",
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


@pytest.mark.parametrize(
    "module",
    ["memlab_rs.line_profiler.merged", "memlab_rs.line_profiler.diff", "memlab_rs.results.diff"],
)
def test_line_profile_examples_hold_whatever_else_is_alive(module):
    """Their figures are what a line allocated, which no other CPU tensor alive in the process
    changes (a line's peak counts every live storage, as on CUDA: another test module's
    model, say, made the merge example's peaks 24 bytes higher)."""
    import torch

    held = torch.nn.Linear(2, 2)  # 24 bytes of CPU storages alive throughout
    mod = importlib.import_module(module)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in doctest.DocTestFinder(exclude_empty=True).find(mod, mod.__name__):
        runner.run(test)
    assert runner.failures == 0
    del held
