"""The CUDA direct reader's setting, checked without a GPU (the reader itself is tested
against torch's binding in tests/gpu/test_line_profiler_cuda.py; the setting taken without
initialising CUDA, in a process of its own: tests/integration/test_line_profiler_processes.py).
"""

from __future__ import annotations

import pytest

from memlab_rs import _core


def test_a_bad_revalidation_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("MEMLAB_RS_CUDA_REVALIDATE_SAMPLES", "often")
    collector = _core.line_profiler.LineCollector("cuda:0")
    with pytest.raises(ValueError, match='MEMLAB_RS_CUDA_REVALIDATE_SAMPLES="often".*>= 1'):
        collector.enable()
    assert not collector.enabled
