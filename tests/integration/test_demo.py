"""`python -m memlab_rs.demo` (what `make demo` runs): it works and warns about nothing."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_and_prints_no_warning():
    proc = subprocess.run(
        [sys.executable, "-W", "default", "-m", "memlab_rs.demo", "--steps", "1"]
        + ["--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    out = proc.stdout
    assert out.startswith("memlab_rs demo: TinyGPT trained 1 steps on cpu")
    assert "wte.weight+lm_head.weight" in out  # the tied weight, under both names
    assert "## train_step" in out and "## Block.forward" in out
    # The monitor's block for the bundled model, the tracker's diff, the estimate's table.
    assert "Memory Usage for Iteration 2 of Epoch 1" in out
    assert "  wte.weight+lm_head.weight grad" in out
    assert "+ | 1 * Size:(8, 64, 1000)        | Memory: 1.9531 M" in out
    assert "Model TinyGPT : params: 3.750912M" in out
