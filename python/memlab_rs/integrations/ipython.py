"""The IPython extension: ``%load_ext memlab_rs``, then ``%mlrun`` and ``%%mlrun``.

pytorch_memlab's magics with the same flags, and what they got wrong fixed: a function
defined in the profiled cell itself can be profiled, ``-q`` really is quiet, ``-T`` dumps
the columns shown, a line magic's statement runs as typed (spaces and quotes included), and
a name that does not exist is a usage error that says so. ``--device cpu`` profiles CPU
memory.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, needs_local_scope
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ..line_profiler import DEFAULT_COLUMNS, LineProfiler
from ..line_profiler.targets import defined_functions
from ..results.atomic import write_text

# Options that take a value, in every spelling (the statement starts after the options).
_VALUED = {"-f", "--function", "-c", "--column", "-g", "--gpu", "-T", "--dump-profile", "-d",
           "--device"}
_TOKEN = re.compile(r"""(?:[^\s'"]+|'[^']*'|"[^"]*")+""")


def _split(line: str) -> tuple[str, str]:
    """(options, statement): the statement is the rest of the line, exactly as typed."""
    at = 0
    options: list[str] = []
    while True:
        match = _TOKEN.search(line, at)
        if match is None:
            return " ".join(options), ""
        token = match.group()
        if token == "--":
            return " ".join(options), line[match.end() :].strip()
        if not token.startswith("-") or token == "-":
            return " ".join(options), line[match.start() :].strip()
        options.append(token)
        at = match.end()
        if token in _VALUED:
            value = _TOKEN.search(line, at)
            if value is None:
                raise UsageError(f"%mlrun: option {token} needs a value")
            options.append(value.group())
            at = value.end()


@magics_class
class MemlabMagics(Magics):
    """The ``%mlrun`` magics (see ``mlrun``)."""

    @magic_arguments()
    @argument(
        "-f",
        "--function",
        metavar="FUNC",
        action="append",
        default=[],
        help="Function to profile, by name (repeatable). It may be defined in the cell itself.",
    )
    @argument(
        "-c",
        "--column",
        metavar="COLS",
        action="append",
        default=[],
        help="Column to show (repeatable): any key of torch.cuda.memory_stats().",
    )
    @argument(
        "-D",
        "--no_default_columns",
        action="store_true",
        help="Hide the default columns " + ", ".join(DEFAULT_COLUMNS),
    )
    @argument("-r", "--return-profiler", action="store_true", help="Return the LineProfiler.")
    @argument("-g", "--gpu", metavar="GPU_ID", default=0, type=int, help="GPU to profile.")
    @argument("-d", "--device", default=None, help='"cpu" or "cuda" (default: CUDA if any).')
    @argument("-q", "--quiet", action="store_true", help="Show nothing.")
    @argument("-T", "--dump-profile", metavar="FILE", help="Write the text report to FILE.")
    @line_cell_magic
    @needs_local_scope
    def mlrun(self, line: str = "", cell: str | None = None, local_ns: Any = None) -> Any:
        """Run a statement (``%mlrun -f f f(1)``) or a cell (``%%mlrun -f f``) under the
        line profiler and show the memory of each line of the functions named with ``-f``.
        """
        options, statement = _split(line)
        args = parse_argstring(self.mlrun, options)
        code = cell if cell is not None else statement
        if not code.strip():
            raise UsageError("%mlrun: nothing to run: give a statement, or use %%mlrun on a cell")
        if not args.function:
            raise UsageError("%mlrun: name the functions to profile with -f FUNC")
        shell = self.shell
        if shell is None:
            raise UsageError("%mlrun runs inside an IPython shell")
        global_ns = shell.user_global_ns
        local_ns = local_ns if local_ns is not None else shell.user_ns
        source = shell.transform_cell(code) if cell is not None else code
        filename = shell.compile.cache(source)
        try:
            compiled = compile(source, filename, "exec")
        except SyntaxError as error:
            raise UsageError(f"%mlrun: the code to run is not valid Python: {error}") from None
        defined = dict(defined_functions(compiled))
        try:  # a GPU or device that does not exist, before anything runs
            profiler = LineProfiler(target_gpu=args.gpu, device=args.device)
        except (TypeError, ValueError) as error:
            raise UsageError(f"%mlrun: {error}") from None
        for name in args.function:
            if name in defined:  # defined by the code we are about to run
                profiler._add_code(defined[name], name)
                continue
            try:
                func = eval(name, global_ns, local_ns)
            except Exception as error:
                known = ", ".join(sorted(defined)) or "none"
                raise UsageError(
                    f"%mlrun: could not find function {name!r} ({type(error).__name__}: "
                    f"{error}); functions the code defines: {known}"
                ) from None
            profiler.add_function(func)
        columns = ([] if args.no_default_columns else list(DEFAULT_COLUMNS)) + args.column
        if not columns:
            raise UsageError("%mlrun: -D hides the default columns: add some with -c COLS")
        try:  # a column that does not exist, before the statement runs
            profiler._checked_columns(columns)
        except (TypeError, ValueError) as error:
            raise UsageError(f"%mlrun -c: {error}") from None
        with profiler:
            exec(compiled, global_ns, local_ns)
        shown = profiler.display(columns=columns)
        if args.dump_profile is not None:
            write_text(shlex.split(args.dump_profile)[0], str(shown))
        if args.return_profiler:
            return profiler
        return None if args.quiet else shown


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%mlrun`` and ``%%mlrun`` (``%load_ext memlab_rs``)."""
    ipython.register_magics(MemlabMagics)
