"""``pytest --memlab-oom DIR``: every test's call runs under ``memlab_rs.oom_guard``, so a
test that runs out of memory leaves a post-mortem in DIR (named by host, process and rank)
and its summary in the test's captured stderr. The test's outcome is its own: the error
goes on unchanged. Registered by ``pytest_memlab_rs`` only when the option is given."""

from __future__ import annotations

from typing import Any

import pytest

from ..doctor import OOMGuard


class OOMPlugin:
    def __init__(self, folder: str):
        self.folder = folder

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: Any) -> Any:
        with OOMGuard(dir=self.folder):
            return (yield)
