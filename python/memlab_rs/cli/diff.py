"""``memlab-rs diff A B``: what grew and what shrank between two results of one kind, and
with ``--fail-over SIZE`` a regression gate (status 1 when something grew by more)."""

from __future__ import annotations

import argparse
import sys

from . import _arguments
from .command import REGRESSION, CliError, Command


class DiffCommand(Command):
    name = "diff"
    help = "what grew and what shrank between two results"
    description = (
        "Compare two results of one kind: line profiles per line (function, line, code: the "
        "change of each column), tensor reports per tensor (name, device: the change in "
        "bytes). Growth is listed first, largest first, then what shrank."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("a", metavar="A", help="the result before")
        parser.add_argument("b", metavar="B", help="the result after")
        _arguments.format_argument(parser, ("text", "json", "csv"))
        _arguments.columns_argument(parser)
        parser.add_argument(
            "--fail-over",
            metavar="SIZE",
            type=_arguments.size_argument,
            help="exit with status 1 when a line or tensor grew by more than SIZE: bytes "
            "(1048576) or a number and a unit, 16M or 16MiB (powers of 1024, as the reports "
            "write sizes), 16MB (powers of 1000); a regression check",
        )

    def run(self, args: argparse.Namespace) -> int:
        from ..line_profiler import DEFAULT_COLUMNS
        from ..results.diff import diff_results
        from . import _output

        columns = _arguments.columns(args)
        chosen = DEFAULT_COLUMNS if columns == _arguments.DEFAULT else columns
        change = diff_results(args.a, args.b, chosen)
        if change.kind != "line_profile" and columns != _arguments.DEFAULT:
            raise CliError(f"--columns applies to line profiles; {args.a} is a {change.kind}")
        if args.format == "json":
            import json

            text = json.dumps(change.to_data(), indent=1) + "\n"
        elif args.format == "csv":
            text = change.to_csv()
        else:
            text = change.text()
        _output.write(text)
        if args.fail_over is not None:
            grown = change.regressions(args.fail_over)
            if grown:
                from .._core import readable_size

                largest = grown[0]
                # A line grown in two columns is one line that grew: count places, not rows.
                if change.kind == "line_profile":
                    what, places = "line", {(r["function"], r["line"]) for r in grown}
                else:
                    what, places = "tensor", {(r["name"], r["device"]) for r in grown}
                count = f"{len(places)} {what}{'' if len(places) == 1 else 's'}"
                _output.write(
                    f"memlab-rs diff: {count} grew by more than "
                    f"{readable_size(args.fail_over)}; the largest "
                    f"+{readable_size(largest['change'])} at {change.where(largest)}\n",
                    stream=sys.stderr,
                )
                return REGRESSION
        return 0
