"""What every ``memlab-rs`` command is (``Command``), and how the command line fails.

A command is a name, its line in ``memlab-rs --help``, its arguments and what it does;
``main`` builds the parser from the commands and hands the parsed arguments to the one
named. A command module imports nothing heavy at its top (no torch, no result class):
``memlab-rs --help`` builds every command's parser and must stay instant.

An error the user can fix (a missing file, an unknown column, a file that is not a result)
is one line on stderr, ``memlab-rs <command>: error: ...``, and exit status 2
(``USAGE_ERROR``); ``diff --fail-over`` exits 1 on a regression (``REGRESSION``); ``run``
exits with the script's own status.
"""

from __future__ import annotations

import argparse
import sys
from typing import ClassVar

# Exit statuses of our own (run passes the script's through).
USAGE_ERROR = 2
REGRESSION = 1


class CliError(Exception):
    """An error the command line reports as one line and exit status 2."""


class ReaderGone(Exception):
    """The reader of our output went away (``memlab-rs show ... | head``): it has what it
    wanted, so the command stops there with status 0."""


class Command:
    """One ``memlab-rs`` command: ``name``, ``help`` (its line in ``memlab-rs --help``),
    ``description`` (``memlab-rs NAME --help``'s text), its arguments
    (``add_arguments``), how they are read (``parse``) and what it does (``run``, which
    returns the exit status)."""

    name: ClassVar[str]
    help: ClassVar[str]
    description: ClassVar[str]
    #: The usage line, where argparse's own would mislead (``run``'s script and its args).
    usage: ClassVar[str | None] = None
    formatter_class: ClassVar[type[argparse.HelpFormatter]] = argparse.HelpFormatter
    #: The errors that are the user's to fix: one line on stderr and status 2. Any other
    #: exception is ours, and its traceback is what a bug report needs.
    usage_errors: ClassVar[tuple[type[Exception], ...]] = (
        CliError,
        ValueError,
        TypeError,
        OSError,
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        raise NotImplementedError

    def parse(
        self,
        main_parser: argparse.ArgumentParser,
        parser: argparse.ArgumentParser,
        argv: list[str],
    ) -> argparse.Namespace:
        """The arguments ``argv`` (what follows the command's name) as ``run`` takes them:
        argparse's, through ``memlab-rs``'s parser (``main_parser``), which says which of
        them it does not know; ``parser`` is this command's own."""
        return main_parser.parse_args([self.name, *argv])

    def run(self, args: argparse.Namespace) -> int:
        raise NotImplementedError


def error_status(command: str, error: BaseException) -> int:
    """Say ``error`` as the one line ``memlab-rs <command>: error: ...`` on stderr (an
    ``OSError``'s file named when its message does not name it); ``USAGE_ERROR``."""
    message = " ".join(str(error).split()) or type(error).__name__
    name = getattr(error, "filename", None)
    if isinstance(error, OSError) and name and str(name) not in message:
        message = f"{name}: {message}"
    print(f"memlab-rs {command}: error: {message}", file=sys.stderr)
    return USAGE_ERROR
