"""The command line: ``memlab-rs`` (and ``python -m memlab_rs``).

    memlab-rs run [--line FUNC ...] [--report] [--trace] [-o FILE] script.py [args ...]
    memlab-rs run [options] -m module [args ...]
    memlab-rs show FILE [--format text|html|json|csv] [--columns ...] [--func ...]
    memlab-rs diff A B [--columns ...] [--format text|json|csv] [--fail-over SIZE]
    memlab-rs merge FILE ... [-o MERGED] [--format text|html|json|csv]
    memlab-rs estimate MODULE:FACTORY [--size N] [--budget SIZE] [--device DEV] [...]

This module parses arguments and dispatches; each command is a module of its own (``run``,
``show``, ``diff``, ``merge``: a ``command.Command``). Building the parser imports no
torch, so ``--help`` and ``--version`` answer at once; a command imports what it needs when
it runs. An error is one line on stderr (``memlab-rs <command>: error: ...``) and exit
status 2; ``diff --fail-over`` exits 1 on a regression; ``run`` exits with the script's own
status.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .command import USAGE_ERROR, Command, ReaderGone, error_status
from .diff import DiffCommand
from .estimate import EstimateCommand
from .merge import MergeCommand
from .run import RunCommand
from .show import ShowCommand

#: The commands, in the order ``memlab-rs --help`` lists them.
COMMANDS: tuple[Command, ...] = (
    RunCommand(),
    ShowCommand(),
    DiffCommand(),
    MergeCommand(),
    EstimateCommand(),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``memlab-rs`` command line with ``argv`` (``sys.argv[1:]`` by default) and
    return its exit status.

    >>> main(["show", "no-such-file.json"])
    2
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, parsers = _parser()
    command = next((c for c in COMMANDS if argv[:1] == [c.name]), None)
    try:
        if command is None:  # --help, --version, a mistake: argparse says so and exits
            args = parser.parse_args(argv)
            command = next((c for c in COMMANDS if c.name == args.command), None)
            if command is None:
                parser.print_help()
                return USAGE_ERROR
        else:
            args = command.parse(parser, parsers[command.name], argv[1:])
        return int(command.run(args))
    except ReaderGone:
        return 0
    except Exception as error:
        if command is None or not isinstance(error, command.usage_errors):
            raise
        return error_status(command.name, error)


# -- arguments ------------------------------------------------------------------------------

_DESCRIPTION = """\
Where your PyTorch memory goes, from the command line.

Run a script under the profilers and save what they found (run), render a saved result
(show), compare two runs (diff), combine the results of the ranks of a distributed job
(merge), and plan a training step's memory before training (estimate). Results are JSON
files that memlab_rs.load() also reads."""

_EXAMPLES = """\
examples:
  memlab-rs run train.py --epochs 1          # @profile in train.py works without an import
  memlab-rs run --line train_step --report train.py
  memlab-rs run --line memlab_rs.models:Block.forward -m memlab_rs.demo
  memlab-rs show memlab_rs.train.4242.json --columns active_bytes.all.peak --format html
  memlab-rs diff before.json after.json --fail-over 16M
  torchrun --nproc-per-node 2 --no-python memlab-rs run --report train.py
  memlab-rs merge memlab_rs.train.*.rank*.tensor_report.json
  memlab-rs estimate models.py:make_gpt --size 16 --budget 80GiB

exit status: run gives the script's own; diff --fail-over gives 1 on a regression; an
error (a missing script or file, an unknown column, a file that is not a result) is one
line on stderr and status 2."""


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """``memlab-rs``'s parser, and each command's own by name."""
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="memlab-rs",
        description=_DESCRIPTION,
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"memlab-rs {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    parsers = {}
    for command in COMMANDS:
        parsers[command.name] = subparsers.add_parser(
            command.name,
            help=command.help,
            description=command.description,
            usage=command.usage,
            formatter_class=command.formatter_class,
        )
        command.add_arguments(parsers[command.name])
    return parser, parsers
