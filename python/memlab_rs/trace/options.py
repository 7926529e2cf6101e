"""The trace's options, checked before anything runs: which frames are not a location
(``exclude``, ``default_exclude()``), how files are shown (``paths``), the keyword groups;
and the analysis's options as the JSON ``_core.trace.TraceAnalysis`` reads.

>>> exclude_parts("torch/")
['torch/']
>>> keyword_groups({"weights": "weight"})
[('weights', ['weight'])]
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import torch

from .. import _args

#: memlab_rs's modules that are user code like any other: its demo and bundled model.
_USER_LIKE = ("demo.py", "models.py")


def default_exclude() -> list[str]:
    """Path parts whose frames are not "the location" of an allocation: torch, the standard
    library and memlab_rs, here and (by their usual install paths) on other machines.

    >>> any("torch" in p for p in default_exclude())
    True
    """
    # memlab_rs's own folder: this file is in memlab_rs/trace/.
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parts = [
        os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
        "-packages/torch/",
    ]
    # memlab_rs's own machinery, its modules and its packages (the rooms and floors); its
    # demo and bundled model are user code like any other.
    for name in sorted(os.listdir(package)):
        if name.endswith(".py") and name not in _USER_LIKE:
            parts.append(f"{os.sep}memlab_rs{os.sep}{name}")
        elif os.path.isfile(os.path.join(package, name, "__init__.py")):
            parts.append(f"{os.sep}memlab_rs{os.sep}{name}{os.sep}")
    # The standard library, here or on the machine that recorded: /.../lib/python3.N/
    # outside site-packages (a virtual environment's lib/python3.N/ holds site-packages too,
    # so its path alone cannot say).
    parts.append("<stdlib>")
    return list(dict.fromkeys(parts))


def exclude_parts(exclude: Any) -> list[str]:
    """``exclude`` as a list of path parts: None is ``default_exclude()``; one string (or
    ``os.PathLike``) is one part, never its characters; any other iterable lists parts."""
    if exclude is None:
        return default_exclude()
    if isinstance(exclude, (str, os.PathLike)):
        items: list[Any] = [exclude]
    elif isinstance(exclude, (bytes, bytearray, dict)):
        raise TypeError(
            f"exclude={exclude!r}: give path parts as a list of str (['torch/', '<stdlib>']), "
            "one str, or None for default_exclude()"
        )
    else:
        try:
            items = list(exclude)
        except TypeError:
            raise TypeError(
                f"exclude={exclude!r}: give path parts as a list of str (['torch/', "
                "'<stdlib>']), one str, or None for default_exclude()"
            ) from None
    parts = []
    for i, item in enumerate(items):
        part = os.fspath(item) if isinstance(item, os.PathLike) else item
        if not isinstance(part, str):
            raise TypeError(
                f"exclude[{i}]={item!r}: each path part must be a str (a file whose path "
                "contains it is not a location)"
            )
        if not part:
            raise ValueError(
                f"exclude[{i}] is an empty string: it is part of every path, so no frame "
                "could be a location; leave it out (exclude=[] shows every frame)"
            )
        parts.append(part)
    return parts


def paths_choice(paths: Any, name: str = "paths") -> str:
    """``paths`` checked: ``"short"`` or ``"full"``."""
    if not isinstance(paths, str) or paths not in ("short", "full"):
        raise ValueError(
            f"{name}={paths!r}: use 'short' (packages from their directory, files here "
            "relative to the working directory) or 'full' (paths as recorded)"
        )
    return paths


def cwd() -> str | None:
    """The working directory, which short paths are relative to (None if it is gone)."""
    try:
        return os.getcwd()
    except OSError:
        return None


def analysis_options(exclude: list[str], paths: str) -> str:
    """What ``_core.trace.TraceAnalysis`` is asked with, as its JSON (``result::Options``):
    the checked ``exclude`` and ``paths``, and the working directory here."""
    return json.dumps({"exclude": exclude, "paths": paths, "cwd": cwd()}, ensure_ascii=False)


def keyword_groups(groups: Any) -> list[tuple[str, list[str]]]:
    """``groups`` as (name, keywords) pairs: one string is one keyword, never its
    characters."""
    if not isinstance(groups, Mapping):
        raise TypeError(
            "groups must be a dict of a group's name to its keywords, e.g. "
            f'{{"weights": ["weight"], "attention": ["attn"]}}, got {_args.shown(groups)} '
            f"({type(groups).__name__})"
        )
    out = []
    for name, words in groups.items():
        if not isinstance(name, str):
            raise TypeError(f"groups: the group name {name!r} must be a str")
        listed = [words] if isinstance(words, str) else words
        try:
            listed = list(listed)
        except TypeError:
            raise TypeError(
                f"groups[{name!r}]={words!r}: give the group's keywords as a list of str "
                "(or one str)"
            ) from None
        for word in listed:
            if not isinstance(word, str):
                raise TypeError(
                    f"groups[{name!r}]: the keyword {word!r} must be a str (a row goes to the "
                    "first group with a keyword in its name)"
                )
            if not word:
                raise ValueError(
                    f"groups[{name!r}] has an empty keyword: it is part of every name, so the "
                    "group would take every row; leave it out"
                )
        out.append((name, listed))
    return out
