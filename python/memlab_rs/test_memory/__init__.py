"""A test's memory, as the pytest plugin measured it (kind ``test_memory``): the result the
plugin's ``--memlab-save`` writes and ``memlab_rs.load`` reads. The plugin itself is
``memlab_rs.integrations.pytest_plugin``; the Rust side is ``_core.test_memory``."""

from memlab_rs.test_memory.result import PytestMemoryResult

__all__ = ["PytestMemoryResult"]
