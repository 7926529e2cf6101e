"""``memlab-rs run [options] (script.py | -m module) [args ...]``: a script run as python
runs it, under the profilers its options ask for, and the results saved (``_profiled_run``;
running the script is ``_runner``'s job, finding ``--line`` functions ``line_profiler.targets``').

Our options stop at the script (or ``-m module``): everything after it is the script's,
options included, so ``run`` reads its arguments itself (``split_argv``) before argparse
sees ours."""

from __future__ import annotations

import argparse
import sys

from .command import CliError, Command

_RUN_HELP = """\
Run a Python script (or -m module) as `python script.py args` would: same sys.argv,
__main__, output and exit status. `@profile` works without an import (memlab_rs.profile:
the report also prints at exit, as in-process), --line profiles functions without
decorating them, --report saves a MemReporter tensor report of what the script's globals
hold when it ends, --trace records the allocation history, --oom explains an
out-of-memory error at the failing allocation.

Results are saved in the current directory as memlab_rs.<script>.<pid>[.rank<R>].json
(the line profile), .tensor_report.json and .trace.json; the rank part is there when
the job has several processes (torchrun). Each rank profiles its own device: the local
rank's GPU (LOCAL_RANK), else the CPU."""

_LINE_HELP = """\
profile this function line by line without decorating it (repeatable): a qualified name
the script defines (train_step, Model.forward, main.<locals>.step), or MODULE:QUALNAME for
another module's (memlab_rs.models:Block.forward)"""


class RunCommand(Command):
    name = "run"
    help = "run a script under the profilers and save the results"
    description = _RUN_HELP
    usage = "memlab-rs run [options] (script.py | -m module) [args ...]"
    formatter_class = argparse.RawDescriptionHelpFormatter
    # What goes wrong before the script starts is one line (CliError); the script's own
    # errors are the script's (its traceback, its status), and any other is a bug of ours.
    usage_errors = (CliError,)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--line", metavar="FUNC", action="append", default=[], help=_LINE_HELP)
        parser.add_argument(
            "--report",
            action="store_true",
            help="save a tensor report (MemReporter) of every tensor when the script ends, "
            "named after the script's globals (models, optimizers, tensors)",
        )
        parser.add_argument(
            "--trace",
            action="store_true",
            help="record the allocation history (memlab_rs.trace.Tracer) and save it",
        )
        parser.add_argument(
            "--oom",
            action="store_true",
            help="explain an out-of-memory error where it happens (memlab_rs.oom_guard): a "
            "post-mortem is saved and its summary printed on stderr; the error goes on",
        )
        parser.add_argument(
            "--oom-dir",
            metavar="DIR",
            help="where --oom saves post-mortems (default: the current directory)",
        )
        parser.add_argument(
            "-o",
            "--outfile",
            metavar="FILE",
            help="save the line profile to FILE (other results insert .tensor_report or "
            ".trace before the extension; .gz compresses). {rank}, {world_size}, {pid} and "
            "{stem} are replaced; in a job of several processes .rank<R> is inserted when "
            "FILE has no {rank}",
        )
        parser.add_argument(
            "--device",
            metavar="DEV",
            help="memory to profile: cpu, cuda or cuda:N (default: this rank's GPU, "
            "LOCAL_RANK, when CUDA is available, else cpu)",
        )
        parser.add_argument(
            "-q", "--quiet", action="store_true", help="do not say on stderr where results went"
        )
        parser.add_argument(
            "-m", dest="module", metavar="module", help="run a module, as python -m"
        )
        parser.add_argument("script", nargs="?", help="the script to run")
        parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")

    def parse(
        self,
        main_parser: argparse.ArgumentParser,
        parser: argparse.ArgumentParser,
        argv: list[str],
    ) -> argparse.Namespace:
        """Our options, read by this command's parser; ``target`` ("script" or "module",
        its name) and ``target_args``, the script's arguments, as they were given."""
        options, target, target_args = split_argv(parser, argv)
        parsed = parser.parse_args(options)
        if target is None:
            parser.print_usage(sys.stderr)
            raise CliError("give the script to run (or -m module)")
        parsed.target, parsed.target_args = target, target_args
        return parsed

    def run(self, args: argparse.Namespace) -> int:
        from . import _profiled_run

        kind, name = args.target
        try:
            return _profiled_run.run(args, kind, name, args.target_args)
        except _profiled_run.RunError as error:
            raise CliError(str(error)) from None


def split_argv(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[list[str], tuple[str, str] | None, list[str]]:
    """(our options, ("script" or "module", its name), its arguments): everything after
    the script or ``-m module`` belongs to the script, options included.

    >>> parser = argparse.ArgumentParser()
    >>> RunCommand().add_arguments(parser)
    >>> split_argv(parser, ["-o", "out.json", "-m", "pkg", "--line", "x"])
    (['-o', 'out.json'], ('module', 'pkg'), ['--line', 'x'])
    >>> split_argv(parser, ["--report", "train.py", "-q"])
    (['--report'], ('script', 'train.py'), ['-q'])
    """
    takes_value = {
        s for a in parser._actions if a.option_strings and a.nargs != 0 for s in a.option_strings
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
