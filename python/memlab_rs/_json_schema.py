"""A small language for the shape of JSON values, for ``_result_schema``: each ``Spec``
says what a value must be (``Int(0)``, ``List(Str())``, ``Obj(label, fields)``), tests it
fast (``ok``: a long record holds many values) and, when it fails, says where and
why in a ValueError (``check``): ``tracker row 0: "bytes" must be >= 0, got -5``.

>>> Obj("row {i}", {"bytes": Int(0)}).check_object({"bytes": -5}, "tracker row 0")
Traceback (most recent call last):
...
ValueError: tracker row 0: "bytes" must be >= 0, got -5
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
U32_MAX = (1 << 32) - 1
RANK_MAX = (1 << 31) - 1


def shown(value: Any) -> str:
    """``repr(value)``, cut to 60 characters: a damaged file may hold a whole list there."""
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


class Spec:
    """A JSON value's type. ``ok`` is the fast test; ``check`` says what is wrong."""

    what = "?"

    def ok(self, value: Any) -> bool:
        raise NotImplementedError

    def check(self, value: Any, where: str, key: str, path: str = "") -> None:
        if not self.ok(value):
            self.fail(value, where, key, path)

    def fail(self, value: Any, where: str, key: str, path: str) -> None:
        raise ValueError(f'{where}: "{key}"{path} must be {self.what}, got {shown(value)}')


class Int(Spec):
    """An int (never a bool) from ``lo`` to ``hi``."""

    def __init__(self, lo: int = 0, hi: int = I64_MAX):
        self.lo, self.hi = lo, hi
        self.what = "int"

    def ok(self, value: Any) -> bool:
        return type(value) is int and self.lo <= value <= self.hi

    def fail(self, value: Any, where: str, key: str, path: str) -> None:
        if type(value) is int:
            bound = f">= {self.lo}" if value < self.lo else f"at most {self.hi}"
            raise ValueError(f'{where}: "{key}"{path} must be {bound}, got {shown(value)}')
        super().fail(value, where, key, path)


class Float(Spec):
    """A finite number (an int too)."""

    what = "a number"

    def ok(self, value: Any) -> bool:
        return (type(value) is float and math.isfinite(value)) or type(value) is int


class Str(Spec):
    """A string; ``word``: holding a word (the estimate's phase is split on spaces)."""

    what = "str"

    def __init__(self, word: bool = False):
        self.word = word
        if word:
            self.what = "a non-blank str"

    def ok(self, value: Any) -> bool:
        return type(value) is str and (not self.word or not value.isspace() and value != "")


class Bool(Spec):
    what = "true or false"

    def ok(self, value: Any) -> bool:
        return type(value) is bool


class OneOf(Spec):
    """One of a few strings."""

    def __init__(self, *choices: str):
        self.choices = choices
        self.what = " or ".join(f'"{c}"' for c in choices)

    def ok(self, value: Any) -> bool:
        return type(value) is str and value in self.choices


class Opt(Spec):
    """``spec`` or null."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self.what = f"{spec.what} or null"
        self._ok = spec.ok

    def ok(self, value: Any) -> bool:
        return value is None or self._ok(value)

    def check(self, value: Any, where: str, key: str, path: str = "") -> None:
        if value is not None:
            self.spec.check(value, where, key, path)




class List(Spec):
    """A list of ``item``s."""

    def __init__(self, item: Spec, what: str | None = None):
        self.item = item
        self.what = what or f"a list of {_plural(item)}"
        # The common case, a list of ints, checked by builtins (a long profile or record
        # holds many).
        self._ints = isinstance(item, Int)
        self._bounds = (item.lo, item.hi) if isinstance(item, Int) else (0, 0)

    def ok(self, value: Any) -> bool:
        if type(value) is not list:
            return False
        if self._ints:
            lo, hi = self._bounds
            if len(value) > 16:  # builtins beat a loop on long lists
                return all(type(v) is int for v in value) and lo <= min(value) <= max(value) <= hi
            for v in value:
                if type(v) is not int or not lo <= v <= hi:
                    return False
            return True
        ok = self.item.ok
        for v in value:
            if not ok(v):
                return False
        return True

    def check(self, value: Any, where: str, key: str, path: str = "") -> None:
        if type(value) is not list:
            self.fail(value, where, key, path)
        if self.ok(value):
            return
        for i, item in enumerate(value):
            if isinstance(self.item, Obj):
                self.item.check_object(item, self.item.label(where, key, i, item))
            else:
                self.item.check(item, where, key, f"{path}[{i}]")


class Tuple(Spec):
    """A fixed-length list, each position its own spec."""

    def __init__(self, what: str, *items: Spec):
        self.items = items
        self.what = what
        self._oks = tuple(s.ok for s in items)

    def ok(self, value: Any) -> bool:
        if type(value) is not list or len(value) != len(self._oks):
            return False
        for ok, v in zip(self._oks, value):
            if not ok(v):
                return False
        return True

    def check(self, value: Any, where: str, key: str, path: str = "") -> None:
        if type(value) is not list or len(value) != len(self.items):
            self.fail(value, where, key, path)
        for i, (spec, item) in enumerate(zip(self.items, value)):
            spec.check(item, where, key, f"{path}[{i}]")


class Map(Spec):
    """An object of any keys (``keys`` a pattern they match) whose values are ``value``s."""

    def __init__(self, value: Spec, keys: str | None = None, keys_what: str = ""):
        self.value = value
        self.keys = re.compile(keys) if keys else None
        self.keys_what = keys_what
        self.what = f"an object of {_plural(value)}"

    def ok(self, value: Any) -> bool:
        if type(value) is not dict:
            return False
        if self.keys is not None and not all(self.keys.fullmatch(k) for k in value):
            return False
        ok = self.value.ok
        return all(ok(v) for v in value.values())

    def check(self, value: Any, where: str, key: str, path: str = "") -> None:
        if type(value) is not dict:
            self.fail(value, where, key, path)
        for k, v in value.items():
            if self.keys is not None and not self.keys.fullmatch(k):
                raise ValueError(f'{where}: "{key}"{path} must be keyed by {self.keys_what}')
            self.value.check(v, f"{where} {key}{path}", k)


class Obj(Spec):
    """An object with ``fields`` (required) and ``optional`` ones, each of its spec; other
    keys are allowed and ignored. ``rules`` check what lies between fields.
    ``label``: how messages name it, from its parent's name (``{parent}``), its key
    (``{key}``), in a list its index (``{i}``), and its own ``"device"`` (``{device}``)."""

    what = "an object"

    def __init__(
        self,
        label: str,
        fields: dict[str, Spec],
        optional: dict[str, Spec] | None = None,
        rules: tuple[Callable[[dict[str, Any], str], None], ...] = (),
    ):
        self._label = label
        self.fields = fields
        self.optional = optional or {}
        self.rules = rules

    def label(self, parent: str, key: str, i: int | None = None, value: Any = None) -> str:
        device = value.get("device") if type(value) is dict else None
        return self._label.format(
            parent=parent, key=key, i=i, device=device if type(device) is str else "?"
        )

    def ok(self, value: Any) -> bool:
        if type(value) is not dict:
            return False
        for key, spec in self.fields.items():
            if key not in value or not spec.ok(value[key]):
                return False
        for key, spec in self.optional.items():
            if key in value and not spec.ok(value[key]):
                return False
        return not self.rules  # rules say their own messages

    def check(self, value: Any, where: str, key: str, path: str = "") -> None:
        if type(value) is not dict:
            self.fail(value, where, key, path)
        self.check_object(value, self.label(where, key, None, value))

    def check_object(self, value: Any, where: str) -> None:
        if type(value) is not dict:
            raise ValueError(f"{where}: expected an object, got {shown(value)}")
        for key, spec in self.fields.items():
            if key not in value:
                raise ValueError(f'{where}: no "{key}" field')
            spec.check(value[key], where, key)
        for key, spec in self.optional.items():
            if key in value:
                spec.check(value[key], where, key)
        for rule in self.rules:
            rule(value, where)


def _plural(spec: Spec) -> str:
    names = {Int: "ints", Str: "strings", Float: "numbers", Bool: "booleans"}
    for kind, name in names.items():
        if type(spec) is kind:
            return name
    if isinstance(spec, Obj):
        return "objects"
    return spec.what + "s" if not spec.what.startswith("a ") else f"({spec.what})"
