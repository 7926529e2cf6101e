"""The house rules of src/, checked from the code itself (`make lint` runs this).

The crate is a house (docs/architecture.md): floors at the bottom that every room may use
(`FLOORS`, lowest first), and one room per capability above them. Arrows point down:

- a floor never uses a room, nor a floor above it;
- a room never uses another room (a piece two rooms need moves down to a floor);
- inside a room or floor, the files' uses form no circle;
- only the files whose job is Python's boundary mention pyo3 (`PYO3_ALLOWED`).

"Uses" are read from the source: `use crate::...` and `use super::...` trees (groups
included) and every `crate::a::b` path in code, comments and strings left out. lib.rs, the
crate's root, registers the rooms and is above them all.

Run: python .ci/rust_layers.py [SRC]   (exit status 1 and one line per fault when broken)
"""

from __future__ import annotations

import fnmatch
import re
import sys
from pathlib import Path

#: The floors, lowest first: a floor may use the floors before it.
FLOORS = ["interrupts", "text", "allocator", "sources", "gc_walk", "results"]

#: Files that may mention pyo3: the root, each room's binding (py.rs, or a py/ folder for a
#: room whose collector is itself interpreter hooks), the floors whose job is the
#: interpreter (the gc walk, interrupts.rs), and each floor's own binding files (its py.rs;
#: the sources' at any depth, and the CPU source's py/ folder, whose hook reads frames).
#: fnmatch's `*` crosses `/`: the floors' entries say which files are meant, not more.
PYO3_ALLOWED = [
    "lib.rs",
    "*/py.rs",
    "*/py/*",
    "interrupts.rs",
    "gc_walk/*",
    "sources/py.rs",
    "sources/**/py.rs",
    "sources/cpu/py/*",
    "results/py.rs",
    "text/py.rs",
]

_WORD = r"[A-Za-z_][A-Za-z0-9_]*"


def strip(code: str) -> str:
    """The code without comments, string and char literals (so that a path in a doc comment
    or a message is not a use)."""
    out, i, n = [], 0, len(code)
    while i < n:
        c = code[i]
        if code.startswith("//", i):
            j = code.find("\n", i)
            i = n if j < 0 else j
        elif code.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if code.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif code.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif re.match(r'r#*"', code[i : i + 8]) and (i == 0 or not code[i - 1].isalnum()):
            hashes = len(re.match(r"r(#*)", code[i:]).group(1))
            end = code.find('"' + "#" * hashes, i + 2 + hashes)
            i = n if end < 0 else end + 1 + hashes
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and code[i] != '"':
                i += 2 if code[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", code[i : i + 4]):
            i = code.find("'", i + 2) + 1  # a char literal (not a lifetime)
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def module_of(path: Path, src: Path) -> tuple[str, ...]:
    """src/a/b.rs -> (a, b); src/a/mod.rs -> (a,); src/lib.rs -> ()."""
    parts = path.relative_to(src).with_suffix("").parts
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return tuple(parts)


def _expand(tree: str) -> list[str]:
    """A use tree (`a::{b, c::{d, e}}`) as its paths (`a::b`, `a::c::d`, `a::c::e`)."""
    tree = re.sub(r"\s+", "", tree)
    depth, top = 0, []
    start = 0
    for i, c in enumerate(tree):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            top.append(tree[start:i])
            start = i + 1
    top.append(tree[start:])
    paths = []
    for item in filter(None, top):
        brace = item.find("{")
        if brace < 0:
            paths.append(re.sub(r"\bas\b.*", "", item))
            continue
        prefix = item[:brace]
        for inner in _expand(item[brace + 1 : item.rfind("}")]):
            paths.append(prefix + inner)
    return paths


def uses(code: str, here: tuple[str, ...], is_folder: bool) -> set[tuple[str, ...]]:
    """The module paths (possibly ending in an item's name) this file's code refers to."""
    code = strip(code)
    found: set[tuple[str, ...]] = set()
    # `super` in a mod.rs names the folder's parent; in a.rs beside others, a's parent.
    base = here if is_folder else here
    for tree in re.findall(r"\buse\s+([^;]+);", code):
        for p in _expand(tree):
            segs = [s for s in p.split("::") if s and s != "*"]
            if not segs:
                continue
            if segs[0] == "crate":
                found.add(tuple(segs[1:]))
            elif segs[0] in ("super", "self"):
                at = list(base)
                while segs and segs[0] in ("super", "self"):
                    if segs.pop(0) == "super":
                        at = at[:-1]
                found.add(tuple(at + segs))
    for p in re.findall(rf"\bcrate((?:::{_WORD})+)", code):
        found.add(tuple(p.split("::")[1:]))
    for p in re.findall(rf"\b((?:super::)+)((?:{_WORD}::)*{_WORD})", code):
        ups, rest = p
        at = list(base)[: len(base) - ups.count("super::")]
        found.add(tuple(at + rest.split("::")))
    return found


def check(src: Path) -> list[str]:
    """Every fault of the house rules in the crate at `src`, one sentence each."""
    files = sorted(src.rglob("*.rs"))
    modules = {module_of(f, src): f for f in files}
    faults: list[str] = []
    edges: dict[tuple[str, ...], set[tuple[str, ...]]] = {m: set() for m in modules}
    for mod, path in modules.items():
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(src).as_posix()
        if "pyo3" in strip(text) and not any(fnmatch.fnmatch(rel, p) for p in PYO3_ALLOWED):
            faults.append(f"{rel}: uses pyo3, which only a room's py.rs (or py/) may")
        for target in uses(text, mod, path.name == "mod.rs"):
            # The longest known module the path starts with (the rest names an item).
            known = next(
                (target[:k] for k in range(len(target), 0, -1) if target[:k] in modules), None
            )
            if known is None or known == mod:
                continue
            edges[mod].add(known)
            if not mod:
                continue  # lib.rs stands above everything
            top, other = mod[0], known[0]
            if top == other:
                continue
            shown = "::".join(known[:2])
            if other not in FLOORS:
                what = "a floor" if top in FLOORS else "a room"
                faults.append(f"{rel}: {what} ({top}) uses the room {other} (crate::{shown})")
            elif top in FLOORS and FLOORS.index(other) > FLOORS.index(top):
                faults.append(
                    f"{rel}: the floor {top} uses {other}, a floor above it (crate::{shown})"
                )
    faults += [f"a circle of uses: {' -> '.join(c)}" for c in _circles(edges)]
    return list(dict.fromkeys(faults))


def _circles(edges: dict[tuple[str, ...], set[tuple[str, ...]]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each as a loop."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on: set = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                names = sorted("::".join(g) or "crate" for g in group)
                found.append(names + [names[0]])

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def main(argv: list[str]) -> int:
    src = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parents[1] / "src")
    faults = check(src)
    for fault in faults:
        print(f"rust layers: {fault}")
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
