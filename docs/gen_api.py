"""Write docs/api.md, the API reference, from the docstrings of the public API.

    python docs/gen_api.py          # rewrite docs/api.md
    python docs/gen_api.py --check  # fail if docs/api.md is out of date (the tests do this)
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import memlab_rs
import memlab_rs.trace
from memlab_rs.integrations import ipython as magics

OUT = Path(__file__).with_name("api.md")
# The magic's docstring also carries argparse's help, whose layout changes between Python
# versions: the reference shows this summary and a table built from the parser instead.
MLRUN_SUMMARY = (
    "Run a statement (`%mlrun -f f f(1)`) or a cell (`%%mlrun -f f`) under the line "
    "profiler and show the memory of each line of the functions named with `-f`. The "
    "statement of the line magic is the rest of the line, as typed."
)


def _doc(obj) -> str:
    return inspect.cleandoc(inspect.getdoc(obj) or "(no docstring)")


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _members(cls):
    """The class's own members, then the documented ones it inherits from memlab_rs's
    classes (``save`` from ``results.SavedResult``), each under the first class defining it."""
    seen: set[str] = set()
    for owner in cls.__mro__:
        if not owner.__module__.startswith("memlab_rs"):
            continue
        for name, member in vars(owner).items():
            if name in seen:
                continue
            seen.add(name)
            if name.startswith("_") and name not in ("__init__",):
                continue
            if owner is not cls and not inspect.getdoc(member):
                continue  # a base's placeholder (SavedResult.text): the subclass's job
            if isinstance(member, property):
                yield name, member, "property"
            elif isinstance(member, staticmethod):  # Courtesy.region/pause/resume
                yield name, member.__func__, "static method"
            elif inspect.isfunction(member):
                yield name, member, "method"


def render() -> str:
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings by `python docs/gen_api.py`; do not edit by hand.",
        "",
    ]
    for module, prefix in ((memlab_rs, "memlab_rs"), (memlab_rs.trace, "memlab_rs.trace")):
        if module is memlab_rs.trace:
            lines += [f"## module `{prefix}`", "", _doc(module), ""]
        lines += _module(module, prefix)
    lines += _magics()
    return "\n".join(lines).rstrip() + "\n"


def _module(module, prefix: str) -> list[str]:
    lines: list[str] = []
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj):
            lines += [f"## class `{prefix}.{name}{_signature(obj)}`", "", _doc(obj), ""]
            for member_name, member, kind in _members(obj):
                if member_name == "__init__":
                    continue
                if kind == "property":
                    lines += [f"### `{name}.{member_name}` (property)", "", _doc(member), ""]
                elif kind == "static method":
                    sig = _signature(member)
                    lines += [f"### `{name}.{member_name}{sig}` (static)", "", _doc(member), ""]
                else:
                    sig = _signature(member)
                    lines += [f"### `{name}.{member_name}{sig}`", "", _doc(member), ""]
        elif callable(obj):
            lines += [f"## `{prefix}.{name}{_signature(obj)}`", "", _doc(obj), ""]
        else:
            lines += [f"## `{prefix}.{name}`", "", f"`{obj!r}`", ""]
    return lines


def _magics() -> list[str]:
    lines = [
        "## IPython: `%load_ext memlab_rs`",
        "",
        _doc(memlab_rs.load_ipython_extension),
        "",
        "### `%mlrun [options] statement` / `%%mlrun [options]` + cell",
        "",
        MLRUN_SUMMARY,
        "",
        "| option | meaning |",
        "|---|---|",
    ]
    for action in magics.MemlabMagics.mlrun.parser._actions:
        if not action.option_strings or "-h" in action.option_strings:
            continue
        value = f" {action.metavar or action.dest.upper()}" if action.nargs != 0 else ""
        flags = ", ".join(f"`{flag}{value}`" for flag in action.option_strings)
        lines.append(f"| {flags} | {action.help} |")
    lines.append("")
    return lines


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv:
        stale = OUT.read_text() != text
        sys.exit("docs/api.md is out of date: run python docs/gen_api.py" if stale else 0)
    OUT.write_text(text)
