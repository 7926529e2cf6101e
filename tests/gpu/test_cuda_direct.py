"""The CUDA direct reader's setting, checked without a GPU (the reader itself is tested
against torch's binding in test_line_profiler_cuda.py)."""

from __future__ import annotations

import pytest

from memlab_rs import _core


def test_a_bad_revalidation_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("MEMLAB_RS_CUDA_REVALIDATE_SAMPLES", "often")
    collector = _core.LineCollector("cuda:0")
    with pytest.raises(ValueError, match='MEMLAB_RS_CUDA_REVALIDATE_SAMPLES="often".*>= 1'):
        collector.enable()
    assert not collector.enabled


def test_a_good_revalidation_setting_is_taken_and_initialises_nothing(script):
    # A fresh interpreter: whether CUDA is up must not depend on the tests run before.
    out = script(
        """
        import os, torch
        os.environ["MEMLAB_RS_CUDA_REVALIDATE_SAMPLES"] = "64"
        from memlab_rs import _core
        collector = _core.LineCollector("cuda:0")
        collector.enable()
        try:
            assert collector.enabled
            assert collector.stats_reader == "torch._C._cuda_memoryStats"
            assert not torch.cuda.is_initialized()
        finally:
            collector.disable()
        assert collector.stats_reader is None
        print("ok")
        """
    )
    assert out.strip() == "ok"
