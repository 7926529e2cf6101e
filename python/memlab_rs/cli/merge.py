"""``memlab-rs merge FILE ...``: the results of the ranks of a distributed job combined (per
line or tensor, the min, median and max across ranks and the rank holding the max)."""

from __future__ import annotations

import argparse
from typing import Any

from . import _arguments
from .command import CliError, Command


class MergeCommand(Command):
    name = "merge"
    help = "combine the results of the ranks of a distributed job"
    description = (
        "Combine one result per rank (line profiles, or tensor reports): per line or "
        "tensor, the min, median and max across ranks and the rank holding the max, so that "
        "an imbalance stands out. Each file's rank is read from the file."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("files", metavar="FILE", nargs="+")
        parser.add_argument(
            "-o", "--outfile", metavar="MERGED", help="also save the merged result to MERGED"
        )
        _arguments.format_argument(parser, ("text", "html", "json", "csv"))
        _arguments.columns_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        from ..results.merge import merge_results
        from . import _output

        merged = merge_results(args.files)
        columns = _arguments.columns(args)
        if merged.kind != "merged_line_profile" and columns != _arguments.DEFAULT:
            raise CliError("--columns applies to line profiles; these are tensor reports")
        view: dict[str, Any] = {} if columns == _arguments.DEFAULT else {"columns": columns}
        if args.outfile:
            merged.save(args.outfile)
        _output.write(_output.formatted(merged, args.format, view))
        return 0
