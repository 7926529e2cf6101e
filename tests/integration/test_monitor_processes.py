"""The training monitor (memory_profiler) in a fresh interpreter (the `script` fixture):
the process-level tests of the monitor (moved from tests/unit/monitor/test_monitor.py). The
original's block of a fixed example, line for line against the golden file (in the test
process, tensors other tests leave alive would be counted)."""

from __future__ import annotations

import paths

FIXTURES = paths.FIXTURES / "monitor"


def test_golden_block(script):
    # A fresh interpreter, so the CPU source's figures hold only this example's tensors.
    out = script(
        """
        import torch, memlab_rs
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(2000, 1000), torch.nn.ReLU(), torch.nn.Linear(1000, 10))
        opt = torch.optim.Adam(model.parameters())
        monitor = memlab_rs.memory_profiler(model, print_period=2, optimizer=opt)
        for epoch in range(2):
            for _ in range(2):
                loss = model(torch.randn(512, 2000)).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                monitor.record_stats()
            monitor.epoch_end()
        monitor.stop()
        """
    )
    expected = (FIXTURES / "adam_mlp.txt").read_text()
    assert out.splitlines() == expected.splitlines()
