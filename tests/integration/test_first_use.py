"""Each tool works as the first thing a fresh process does with memlab_rs: `import memlab_rs`
is lazy, so no module that others import (the CPU source's torch glue, say) may be taken
for granted. A CPU monitor used first failed with "memlab_rs._cpu_source was not imported"."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

FIRST_USES = {
    "monitor": """
        model = torch.nn.Linear(64, 64)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with memlab_rs.memory_profiler(model, optimizer=opt, device="cpu", file=io.StringIO()) as m:
            model(torch.ones(8, 64)).sum().backward()
            opt.step()
            m.record_stats()
        assert m.rows()[0]["peak_allocated"] > 0
    """,
    "line_profiler": """
        def f():
            return torch.zeros(1024, 1024)
        with memlab_rs.LineProfiler(f, device="cpu") as p:
            f()
        assert p.result().text()
    """,
    "tracer": """
        with memlab_rs.trace.Tracer(device="cpu") as t:
            x = torch.zeros(1024, 1024)
        assert t.result.max_mem() >= 4 << 20
    """,
    "reporter": """
        x = torch.zeros(1024, 1024)
        report = memlab_rs.MemReporter().collect(device="cpu")
        assert report.total_bytes("cpu") >= 4 << 20
    """,
    "tracker": """
        tracker = memlab_rs.MemTracker(device="cpu", path=sys.argv[1])
        x = torch.zeros(1024, 1024)
        assert tracker.track().total_storage_bytes >= 4 << 20
    """,
}


@pytest.mark.parametrize("tool", sorted(FIRST_USES))
def test_each_tool_works_first_in_a_fresh_process(tool, tmp_path):
    code = "import io, sys\nimport torch\nimport memlab_rs\n" + textwrap.dedent(FIRST_USES[tool])
    proc = subprocess.run(
        [sys.executable, "-c", code, f"{tmp_path}/"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
