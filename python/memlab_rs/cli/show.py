"""``memlab-rs show FILE``: a saved result rendered as text, HTML, JSON or CSV."""

from __future__ import annotations

import argparse
from typing import Any

from . import _arguments
from .command import CliError, Command


class ShowCommand(Command):
    name = "show"
    help = "render a saved result"
    description = (
        "Render a saved result (any kind memlab_rs.load reads) as text, HTML, JSON (the "
        "file's document) or CSV."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("file", metavar="FILE")
        _arguments.format_argument(parser, ("text", "html", "json", "csv"))
        _arguments.columns_argument(parser)
        parser.add_argument(
            "--func",
            metavar="NAME",
            action="extend",
            nargs="+",
            help="line profiles: only these functions (qualified names)",
        )
        parser.add_argument("-o", "--outfile", metavar="OUT", help="write to OUT instead of stdout")

    def run(self, args: argparse.Namespace) -> int:
        from . import _output

        result = _output.load(args.file)
        columns = _arguments.columns(args)
        kind = result.kind
        line_profile = kind in ("line_profile", "merged_line_profile")
        if not line_profile and (columns != _arguments.DEFAULT or args.func):
            raise CliError(f"--columns and --func apply to line profiles; {args.file} is a {kind}")
        view: dict[str, Any] = {}
        if line_profile:
            view = {"func": args.func}
            if columns != _arguments.DEFAULT:
                view["columns"] = columns
        _output.write(_output.formatted(result, args.format, view), args.outfile)
        return 0
