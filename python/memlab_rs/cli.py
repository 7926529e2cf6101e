"""The command line: ``memlab-rs`` (and ``python -m memlab_rs``).

    memlab-rs run [--line FUNC ...] [--report] [--trace] [-o FILE] script.py [args ...]
    memlab-rs run [options] -m module [args ...]
    memlab-rs show FILE [--format text|html|json|csv] [--columns ...] [--func ...]
    memlab-rs diff A B [--columns ...] [--format text|json|csv] [--fail-over SIZE]
    memlab-rs merge FILE ... [-o MERGED] [--format text|html|json|csv]

This module parses arguments and dispatches; running the script is ``_runner``'s job,
finding ``--line`` functions ``line_profiler.targets``', merging and diffing ``merge``'s and
``diff``'s, rendering the result classes'. An error is one line on stderr
(``memlab-rs <command>: error: ...``) and exit status 2; ``diff --fail-over`` exits 1 on
a regression; ``run`` exits with the script's own status.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

# Exit statuses of our own (run passes the script's through).
USAGE_ERROR = 2
REGRESSION = 1


class CliError(Exception):
    """An error the command line reports as one line and exit status 2."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``memlab-rs`` command line with ``argv`` (``sys.argv[1:]`` by default) and
    return its exit status.

    >>> main(["show", "no-such-file.json"])
    2
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if argv and argv[0] == "run":
        return _run_command(parser, argv[1:])
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return USAGE_ERROR
    try:
        return int(args.handler(args))
    except BrokenPipeError:  # `memlab-rs show ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 0
    except (CliError, ValueError, TypeError, OSError) as error:
        return _error(args.command, error)


def _error(command: str, error: BaseException) -> int:
    message = " ".join(str(error).split()) or type(error).__name__
    name = getattr(error, "filename", None)
    if isinstance(error, OSError) and name and str(name) not in message:
        message = f"{name}: {message}"
    print(f"memlab-rs {command}: error: {message}", file=sys.stderr)
    return USAGE_ERROR


# -- arguments ------------------------------------------------------------------------------

_DESCRIPTION = """\
Where your PyTorch memory goes, from the command line.

Run a script under the profilers and save what they found (run), render a saved result
(show), compare two runs (diff), and combine the results of the ranks of a distributed job
(merge). Results are JSON files that memlab_rs.load() also reads."""

_EXAMPLES = """\
examples:
  memlab-rs run train.py --epochs 1          # @profile in train.py works without an import
  memlab-rs run --line train_step --report train.py
  memlab-rs run --line memlab_rs.models:Block.forward -m memlab_rs.demo
  memlab-rs show memlab_rs.train.4242.json --columns active_bytes.all.peak --format html
  memlab-rs diff before.json after.json --fail-over 16M
  torchrun --nproc-per-node 2 --no-python memlab-rs run --report train.py
  memlab-rs merge memlab_rs.train.*.rank*.tensor_report.json

exit status: run gives the script's own; diff --fail-over gives 1 on a regression; an
error (a missing script or file, an unknown column, a file that is not a result) is one
line on stderr and status 2."""

_RUN_HELP = """\
Run a Python script (or -m module) as `python script.py args` would: same sys.argv,
__main__, output and exit status. `@profile` works without an import (memlab_rs.profile:
the report also prints at exit, as in-process), --line profiles functions without
decorating them, --report saves a MemReporter tensor report of what the script's globals
hold when it ends, --trace records the allocation history.

Results are saved in the current directory as memlab_rs.<script>.<pid>[.rank<R>].json
(the line profile), .tensor_report.json and .trace.json; the rank part is there when
the job has several processes (torchrun). Each rank profiles its own device: the local
rank's GPU (LOCAL_RANK), else the CPU."""

_LINE_HELP = """\
profile this function line by line without decorating it (repeatable): a qualified name
the script defines (train_step, Model.forward, main.<locals>.step), or MODULE:QUALNAME for
another module's (memlab_rs.models:Block.forward)"""


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="memlab-rs",
        description=_DESCRIPTION,
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"memlab-rs {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="run a script under the profilers and save the results",
        description=_RUN_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="memlab-rs run [options] (script.py | -m module) [args ...]",
    )
    run.add_argument("--line", metavar="FUNC", action="append", default=[], help=_LINE_HELP)
    run.add_argument(
        "--report",
        action="store_true",
        help="save a tensor report (MemReporter) of every tensor when the script ends, named "
        "after the script's globals (models, optimizers, tensors)",
    )
    run.add_argument(
        "--trace",
        action="store_true",
        help="record the allocation history (memlab_rs.trace.Tracer) and save it",
    )
    run.add_argument(
        "-o",
        "--outfile",
        metavar="FILE",
        help="save the line profile to FILE (other results insert .tensor_report or .trace "
        "before the extension; .gz compresses). {rank}, {world_size}, {pid} and {stem} are "
        "replaced; in a job of several processes .rank<R> is inserted when FILE has no {rank}",
    )
    run.add_argument(
        "--device",
        metavar="DEV",
        help="memory to profile: cpu, cuda or cuda:N (default: this rank's GPU, "
        "LOCAL_RANK, when CUDA is available, else cpu)",
    )
    run.add_argument(
        "-q", "--quiet", action="store_true", help="do not say on stderr where results went"
    )
    run.add_argument("-m", dest="module", metavar="module", help="run a module, as python -m")
    run.add_argument("script", nargs="?", help="the script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")

    show = commands.add_parser(
        "show",
        help="render a saved result",
        description="Render a saved result (any kind memlab_rs.load reads) as text, HTML, "
        "JSON (the file's document) or CSV.",
    )
    show.add_argument("file", metavar="FILE")
    _format_argument(show, ("text", "html", "json", "csv"))
    _columns_argument(show)
    show.add_argument(
        "--func",
        metavar="NAME",
        action="extend",
        nargs="+",
        help="line profiles: only these functions (qualified names)",
    )
    show.add_argument("-o", "--outfile", metavar="OUT", help="write to OUT instead of stdout")
    show.set_defaults(handler=_show)

    diff = commands.add_parser(
        "diff",
        help="what grew and what shrank between two results",
        description="Compare two results of one kind: line profiles per line (function, "
        "line, code: the change of each column), tensor reports per tensor (name, device: "
        "the change in bytes). Growth is listed first, largest first, then what shrank.",
    )
    diff.add_argument("a", metavar="A", help="the result before")
    diff.add_argument("b", metavar="B", help="the result after")
    _format_argument(diff, ("text", "json", "csv"))
    _columns_argument(diff)
    diff.add_argument(
        "--fail-over",
        metavar="SIZE",
        type=_size_argument,
        help="exit with status 1 when a line or tensor grew by more than SIZE: bytes "
        "(1048576) or a number and a unit, 16M or 16MiB (powers of 1024, as the reports "
        "write sizes), 16MB (powers of 1000); a regression check",
    )
    diff.set_defaults(handler=_diff)

    merge = commands.add_parser(
        "merge",
        help="combine the results of the ranks of a distributed job",
        description="Combine one result per rank (line profiles, or tensor reports): per "
        "line or tensor, the min, median and max across ranks and the rank holding the max, "
        "so that an imbalance stands out. Each file's rank is read from the file.",
    )
    merge.add_argument("files", metavar="FILE", nargs="+")
    merge.add_argument(
        "-o", "--outfile", metavar="MERGED", help="also save the merged result to MERGED"
    )
    _format_argument(merge, ("text", "html", "json", "csv"))
    _columns_argument(merge)
    merge.set_defaults(handler=_merge)
    return parser


def _format_argument(parser: argparse.ArgumentParser, formats: tuple[str, ...]) -> None:
    parser.add_argument(
        "--format",
        choices=formats,
        default="text",
        help="output format (default: text)",
    )


def _columns_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--columns",
        metavar="COL",
        action="extend",
        nargs="+",
        help="line profiles: the columns (keys of torch.cuda.memory_stats(), comma- or "
        "space-separated; 'all' for every saved column; default active_bytes.all.peak "
        "reserved_bytes.all.peak)",
    )


def _size_argument(text: str) -> int:
    """A byte count, as every size memlab_rs takes (``memlab_rs.parse_size``): bytes, or a
    number and a unit (``16M`` and ``16MiB`` are 16 MiB, ``16MB`` 16,000,000 bytes).

    >>> _size_argument("512K"), _size_argument("1.5M"), _size_argument("2MB"), _size_argument("100")
    (524288, 1572864, 2000000, 100)
    """
    from ._core import parse_size

    try:
        return parse_size(text)
    except ValueError as error:  # argparse shows an ArgumentTypeError's message as it is
        why = str(error).split(" is not a size: ", 1)[-1]  # the value as a shell user wrote it
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: {why}") from None


def _columns(args: argparse.Namespace) -> list[str] | None | str:
    """The --columns given: None for 'all', the default marker when not given."""
    if not args.columns:
        return "default"
    names = [c for item in args.columns for c in item.split(",") if c]
    return None if names == ["all"] else names


# -- run ------------------------------------------------------------------------------------


def _run_command(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """``memlab-rs run``: our options stop at the script (or -m module); the rest is its."""
    run = _subparser(parser, "run")
    options, target, args = _split_run_argv(run, argv)
    parsed = run.parse_args(options)
    if target is None:
        run.print_usage(sys.stderr)
        print("memlab-rs run: error: give the script to run (or -m module)", file=sys.stderr)
        return USAGE_ERROR
    from . import _profiled_run

    kind, name = target
    try:
        return _profiled_run.run(parsed, kind, name, args)
    except _profiled_run.RunError as error:
        return _error("run", error)


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise LookupError(name)


def _split_run_argv(
    run: argparse.ArgumentParser, argv: list[str]
) -> tuple[list[str], tuple[str, str] | None, list[str]]:
    """(our options, ("script" or "module", its name), its arguments): everything after
    the script or ``-m module`` belongs to the script, options included."""
    takes_value = {
        s for a in run._actions if a.option_strings and a.nargs != 0 for s in a.option_strings
    }
    options: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            if i + 1 < len(argv):
                return options, ("script", argv[i + 1]), argv[i + 2 :]
            return options, None, []
        if token == "-m":
            if i + 1 < len(argv):
                return options, ("module", argv[i + 1]), argv[i + 2 :]
            options.append(token)  # argparse says -m needs a value
            return options, None, []
        if token.startswith("-m") and not token.startswith("--"):
            return options, ("module", token[2:]), argv[i + 1 :]
        if not token.startswith("-") or token == "-":
            return options, ("script", token), argv[i + 1 :]
        options.append(token)
        if token in takes_value and "=" not in token:
            if i + 1 < len(argv):
                options.append(argv[i + 1])
            i += 1
        i += 1
    return options, None, []


# -- show, diff, merge ----------------------------------------------------------------------


def _show(args: argparse.Namespace) -> int:
    result = _load(args.file)
    columns = _columns(args)
    kind = getattr(result, "kind", "trace recording")
    line_profile = kind in ("line_profile", "merged_line_profile")
    if not line_profile and (columns != "default" or args.func):
        raise CliError(f"--columns and --func apply to line profiles; {args.file} is a {kind}")
    view: dict[str, Any] = {}
    if line_profile:
        view = {"func": args.func}
        if columns != "default":
            view["columns"] = columns
    _write(_formatted(result, args.format, view), args.outfile)
    return 0


def _formatted(result: Any, form: str, view: dict[str, Any]) -> str:
    """``result`` in the output format ``form`` (text, html, json or csv), with the line
    profile's ``view`` (columns, functions); show and merge print through it."""
    if form == "json":
        return _json(result)
    if form == "csv":
        if not hasattr(result, "to_csv"):
            kind = getattr(result, "kind", "trace recording")
            raise CliError(f"a {kind} has no CSV form; use --format text, html or json")
        return str(result.to_csv(**view))  # every saved column unless --columns says
    if form == "html":
        rendered = _render(result, ("html", "_repr_html_"), view)
        return rendered if rendered.endswith("\n") else rendered + "\n"
    return _render(result, ("text", "to_text"), view)


def _json(result: Any) -> str:
    """The result file's document; a trace recording's own JSON."""
    from . import results

    if not hasattr(result, "kind"):
        return str(result.to_json()) + "\n"
    return results.dumps(result, indent=1) + "\n"


def _render(result: Any, methods: tuple[str, ...], view: dict[str, Any]) -> str:
    """The first of ``methods`` the result has a form for; its text when it has none (a
    result without HTML raises NotImplementedError from ``html()``, and its ``_repr_html_``
    returns None, as Jupyter expects)."""
    for name in methods:
        method = getattr(result, name, None)
        if method is None:
            continue
        try:
            rendered = method(**view)
        except NotImplementedError:
            continue
        if rendered is not None:
            return str(rendered)
    return str(result)


def _diff(args: argparse.Namespace) -> int:
    from .line_profiler import DEFAULT_COLUMNS
    from .results.diff import diff_results

    columns = _columns(args)
    change = diff_results(args.a, args.b, DEFAULT_COLUMNS if columns == "default" else columns)
    if change.kind != "line_profile" and columns != "default":
        raise CliError(f"--columns applies to line profiles; {args.a} is a {change.kind}")
    if args.format == "json":
        import json

        text = json.dumps(change.to_data(), indent=1) + "\n"
    elif args.format == "csv":
        text = change.to_csv()
    else:
        text = change.text()
    _write(text, None)
    if args.fail_over is not None:
        grown = change.regressions(args.fail_over)
        if grown:
            from ._core import readable_size

            largest = grown[0]
            # A line grown in two columns is one line that grew: count places, not rows.
            if change.kind == "line_profile":
                what, places = "line", {(r["function"], r["line"]) for r in grown}
            else:
                what, places = "tensor", {(r["name"], r["device"]) for r in grown}
            count = f"{len(places)} {what}{'' if len(places) == 1 else 's'}"
            print(
                f"memlab-rs diff: {count} grew by more than {readable_size(args.fail_over)}; "
                f"the largest +{readable_size(largest['change'])} at {change.where(largest)}",
                file=sys.stderr,
            )
            return REGRESSION
    return 0


def _merge(args: argparse.Namespace) -> int:
    from .results.merge import merge_results

    merged = merge_results(args.files)
    columns = _columns(args)
    if merged.kind != "merged_line_profile" and columns != "default":
        raise CliError("--columns applies to line profiles; these are tensor reports")
    view: dict[str, Any] = {} if columns == "default" else {"columns": columns}
    if args.outfile:
        merged.save(args.outfile)
    _write(_formatted(merged, args.format, view), None)
    return 0


def _load(path: str) -> Any:
    from . import results

    if not os.path.exists(path):
        raise CliError(f"{path}: no such file")
    if path.endswith((".pickle", ".pkl")):  # a trace snapshot (Tracer.result.save(x.pickle))
        from . import trace

        return trace.load(path)
    return results.load(path)


def _write(text: str, path: str | None) -> None:
    if path is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        from .results.atomic import write_text

        write_text(path, text)
