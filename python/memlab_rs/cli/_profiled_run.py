"""``memlab-rs run``: the profilers around the script, and the files they save.

Before the script runs: ``profile`` goes into builtins (memlab_rs's own decorator, on the
global line profiler, so ``@profile`` behaves as it does in-process and still prints at
exit), the ``--line`` functions are registered with that profiler (``line_profiler.targets``), and
``--trace`` starts a ``Tracer``. When the script ends, however it ends, each result is
saved to its own file:

=================  ==============================================================
line profile       ``memlab_rs.<stem>.<pid>[.rank<R>].json`` (or ``-o FILE``)
tensor report      the same name with ``.tensor_report`` before the extension
trace              the same name with ``.trace`` before the extension
=================  ==============================================================

``<stem>`` is the script's name without ``.py`` (the module's name for ``-m``); the rank
part is there when the job has several processes. Files go to the directory ``memlab-rs``
was started in, even if the script changes directory.
"""

from __future__ import annotations

import argparse
import builtins
import os
import sys
from typing import Any

from .. import results
from . import _runner


class RunError(Exception):
    """``memlab-rs run`` cannot start: the message is the one line it prints."""


def run(options: argparse.Namespace, kind: str, name: str, args: list[str]) -> int:
    """Run the script (``kind`` "script") or module (``kind`` "module") ``name`` with
    ``args`` under the profilers ``options`` asks for; save the results; return the
    script's exit status (2 if it ran fine but a result could not be saved)."""
    folder = os.getcwd()
    _check_template(options.outfile)
    device = _device(options.device)
    try:
        main = _runner.script(name, args) if kind == "script" else _runner.module(name, args)
    except _runner.NotRunnable as error:
        raise RunError(str(error)) from None

    from ..line_profiler.global_profiler import _use_device, profile

    if options.device is not None:
        _use_device(device)
    targets = _line_targets(options.line, main)
    builtins.profile = profile  # type: ignore[attr-defined]
    saved: list[tuple[str, str]] = []
    tracer = None
    if options.trace:
        from ..trace import Tracer

        tracer = Tracer(device=device).start()

    guard = None
    if options.oom or options.oom_dir:
        from ..doctor import oom_guard

        guard = oom_guard.install(dir=options.oom_dir or folder)
    try:
        status = _runner.run(main)
    finally:
        if guard is not None:
            oom_guard.uninstall()
    if guard is not None and guard.path is not None:
        saved.append(("out-of-memory post-mortem", str(guard.path)))

    if targets is not None:
        targets.uninstall()
        for missing in targets.waiting:
            _say(f"--line {missing}: its module was never imported, so it was not profiled")
        for missing in targets.not_found:
            _say(f"--line {missing}: the module defines no such function; not profiled")
    found, failed = _save_all(options, main, tracer, folder)
    saved += found
    if failed:
        status = status or 2
    if not saved and not options.quiet:
        _say(
            "nothing was profiled: decorate functions with @profile, or pass --line FUNC, "
            "--report or --trace"
        )
    if not options.quiet:
        for what, path in saved:
            shown = os.path.relpath(path, folder) if path.startswith(folder + os.sep) else path
            _say(f"{what} saved to {shown} (memlab-rs show {shown})")
    return status


def _save_all(
    options: argparse.Namespace, main: _runner.Main, tracer: Any, folder: str
) -> tuple[list[tuple[str, str]], bool]:
    """Save every result asked for or made: (what, path) of each file written, and
    whether one could not be written (said on stderr)."""
    from ..line_profiler.global_profiler import _existing

    base = _base_name(options.outfile, main.stem, folder)
    saved = []
    try:
        if tracer is not None:
            trace = tracer.stop()
            path = _with_kind(base, ".trace")
            trace.save(path)  # a trace result file (.json or .json.gz)
            saved.append(("trace", path))
        profiler = _existing()
        if profiler is not None and profiler._names:
            path = base
            profiler.result().save(path)
            saved.append(("line profile", path))
        if options.report:
            path = _with_kind(base, ".tensor_report")
            _tensor_report(main.module.__dict__, options.device).save(path)
            saved.append(("tensor report", path))
    except OSError as error:
        _say(f"could not save a result: {error}")
        return saved, True
    return saved, False


def _tensor_report(namespace: dict[str, Any], device: str | None) -> Any:
    """Every tensor reachable now, named after the script's globals: its models and
    tensors (``model.fc.weight``, ``extra``) and its optimizers' state."""
    import torch

    from ..tensor_report import MemReporter

    holder = torch.nn.Module()
    optimizers = []
    for key, value in list(namespace.items()):
        if key.startswith("__"):
            continue
        try:
            if isinstance(value, torch.nn.Module):
                holder.add_module(key, value)
            elif isinstance(value, torch.nn.Parameter):
                holder.register_parameter(key, value)
            elif isinstance(value, torch.Tensor):
                holder.register_buffer(key, value)
            elif isinstance(value, torch.optim.Optimizer):
                optimizers.append(value)
        except (KeyError, TypeError):  # a name nn.Module keeps for itself ("training")
            continue
    # pre_collect: garbage in reference cycles is not what the script holds
    reporter = MemReporter(holder, pre_collect=True)
    for optimizer in optimizers:
        reporter.add_optimizer(optimizer)
    return reporter.collect(device=device)


def _line_targets(names: list[str], main: _runner.Main) -> Any:
    if not names:
        return None
    from ..line_profiler.global_profiler import global_line_profiler
    from ..line_profiler.targets import LineTargets

    try:
        targets = LineTargets(global_line_profiler(), names)
        targets.add_main(main.code, main.where)
    except ValueError as error:
        raise RunError(str(error)) from None
    targets.install()
    return targets


def _device(given: str | None) -> str:
    """The device the tools read: ``--device``, else this rank's GPU, else the CPU."""
    from .._torch import line_profiler_device, local_cuda_index

    try:
        return line_profiler_device(given, local_cuda_index())
    except (TypeError, ValueError) as error:
        raise RunError(f"--device {given}: {error}") from None


_PLACEHOLDERS = {"rank": 0, "world_size": 1, "pid": 0, "stem": "script"}


def _check_template(outfile: str | None) -> None:
    if outfile is None:
        return
    try:
        outfile.format(**_PLACEHOLDERS)
    except (KeyError, IndexError, ValueError) as error:
        raise RunError(
            f"-o {outfile}: bad placeholder ({type(error).__name__}: {error}); the file name "
            "may use {rank}, {world_size}, {pid} and {stem}"
        ) from None


def _base_name(outfile: str | None, stem: str, folder: str) -> str:
    """The line profile's path; the other results insert their kind into it."""
    info = results.rank_info()
    several = info["world_size"] > 1
    rank = f".rank{info['rank']}" if several else ""
    if outfile is None:
        name = f"memlab_rs.{stem}.{os.getpid()}{rank}.json"
    else:
        name = outfile.format(
            rank=info["rank"], world_size=info["world_size"], pid=os.getpid(), stem=stem
        )
        if several and "{rank}" not in outfile:  # ranks never write over each other
            name = _with_kind(name, rank)
    return os.path.join(folder, name)


def _with_kind(path: str, kind: str, extension: str | None = None) -> str:
    """``path`` with ``kind`` inserted before its extension (``.json.gz`` counts as one),
    and the extension replaced by ``extension`` when given.

    >>> _with_kind("out.json.gz", ".trace"), _with_kind("out.json", ".rank1", ".pickle")
    ('out.trace.json.gz', 'out.rank1.pickle')
    """
    folder, name = os.path.split(path)
    if name.endswith(".json.gz"):
        root, ext = name[: -len(".json.gz")], ".json.gz"
    else:
        root, ext = os.path.splitext(name)
    return os.path.join(folder, f"{root}{kind}{extension if extension is not None else ext}")


def _say(message: str) -> None:
    sys.stdout.flush()
    print(f"memlab_rs: {message}", file=sys.stderr, flush=True)
