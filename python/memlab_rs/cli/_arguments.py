"""The options several commands share, defined once: ``--format``, ``--columns`` and a size
(``diff --fail-over``), and how ``--columns`` is read."""

from __future__ import annotations

import argparse

#: What ``columns`` gives when ``--columns`` was not given: the kind's default columns.
DEFAULT = "default"


def format_argument(parser: argparse.ArgumentParser, formats: tuple[str, ...]) -> None:
    parser.add_argument(
        "--format",
        choices=formats,
        default="text",
        help="output format (default: text)",
    )


def columns_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--columns",
        metavar="COL",
        action="extend",
        nargs="+",
        help="line profiles: the columns (keys of torch.cuda.memory_stats(), comma- or "
        "space-separated; 'all' for every saved column; default active_bytes.all.peak "
        "reserved_bytes.all.peak)",
    )


def size_argument(text: str) -> int:
    """A byte count, as every size memlab_rs takes (``memlab_rs.parse_size``): bytes, or a
    number and a unit (``16M`` and ``16MiB`` are 16 MiB, ``16MB`` 16,000,000 bytes).

    >>> size_argument("512K"), size_argument("1.5M"), size_argument("2MB"), size_argument("100")
    (524288, 1572864, 2000000, 100)
    """
    from .._core import parse_size

    try:
        return parse_size(text)
    except ValueError as error:  # argparse shows an ArgumentTypeError's message as it is
        why = str(error).split(" is not a size: ", 1)[-1]  # the value as a shell user wrote it
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: {why}") from None


def columns(args: argparse.Namespace) -> list[str] | None | str:
    """The --columns given: None for 'all', ``DEFAULT`` when not given.

    >>> columns(argparse.Namespace(columns=["a,b", "c"])), columns(argparse.Namespace(columns=None))
    (['a', 'b', 'c'], 'default')
    """
    if not args.columns:
        return DEFAULT
    names = [c for item in args.columns for c in item.split(",") if c]
    return None if names == ["all"] else names
