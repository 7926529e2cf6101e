"""The ``memlab-rs`` command line (the console script calls ``main``; ``python -m memlab_rs``
too).

- ``main``: the parser, built from the commands, and the dispatch;
- ``command``: what every command is (``Command``), the exit statuses, the one-line error;
- ``run``, ``show``, ``diff``, ``merge``: one module per command;
- ``_arguments``: the options several commands share; ``_output``: a result loaded,
  rendered in a format and written;
- ``_runner`` and ``_profiled_run``: what ``run`` needs (the script run as python runs it;
  the profilers around it and the files they save).

Importing this package imports no torch: ``memlab-rs --help`` answers at once.
"""

from memlab_rs.cli.main import main

__all__ = ["main"]
