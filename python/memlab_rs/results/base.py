"""What every result class shares: ``Result``.

A result is data the Rust core made: a plain struct of the room's ``result.rs`` with serde's
derive, which reaches Python once, as the JSON text that derive writes, and goes back once
to be rendered, merged or diffed. The class keeps that text (``data_json()``) and parses it
only when asked for data (``to_data()``); its own attributes read from that data. Nothing
is marshalled field by field, and the text a result saves is the text Rust wrote.

A result class says which room's submodule of ``_core`` holds its Rust side (``_rust``),
whose functions every room provides the same way:

- ``validate(data_json) -> data_json``: the document read by the derive, or a
  ``ValueError`` naming the field that does not fit (this is the schema check of a loaded
  file and of what a constructor was given);
- ``render(data_json, format, view_json) -> str``: ``"text"``, ``"html"``, ``"csv"`` or
  ``"json"`` (what the kind has), with the view's options (``func``, ``columns``...) as a
  JSON object.

Its public constructor keeps its own signature and hands the data to ``_set_data``;
``from_data`` and ``_from_json`` rebuild it from a saved file without the constructor.
``SavedResult``, the older name, is the same class.
"""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar

from .files import save


class Result:
    """What every result class shares: ``save(path)``, ``str()`` and ``repr()`` as its
    ``text()``, Jupyter's display as its ``html()`` (plain text where it has none), and
    for a kind whose data Rust holds (``_rust``), ``to_data()``, ``from_data()``,
    ``render()``, ``text()`` and ``html()`` from that data."""

    kind: ClassVar[str]
    #: The room's submodule of ``_core`` (``validate`` and ``render``), or None for a kind
    #: that still builds its data in Python.
    _rust: Any = None
    #: The formats ``render`` takes for this kind.
    _formats: ClassVar[tuple[str, ...]] = ("text",)
    meta: dict[str, Any]
    _json: str
    _data: Any

    # -- data ---------------------------------------------------------------------------

    def _set_data(self, data: dict[str, Any] | str, meta: dict[str, Any]) -> None:
        """Hold ``data`` (a dict, or JSON text) as the room's derive reads it: checked, in
        its canonical form."""
        text = data if isinstance(data, str) else _dumps(data)
        self._json = self._rust.validate(text)
        self._data = None
        self.meta = meta

    @classmethod
    def _from_json(cls, data_json: str, meta: dict[str, Any]) -> Any:
        """The result from its data's JSON text (a saved file's, or what Rust made)."""
        result = cls.__new__(cls)
        result._set_data(data_json, meta)
        return result

    @classmethod
    def from_data(cls, data: dict[str, Any], meta: dict[str, Any]) -> Any:
        """The result from a saved file's ``data`` and ``meta``; a ValueError naming the
        field that does not fit."""
        if cls._rust is None:
            raise NotImplementedError
        return cls._from_json(_dumps(data), meta)

    def to_data(self) -> dict[str, Any]:
        """The result as JSON values (the saved file's ``data``)."""
        if self._rust is None:
            raise NotImplementedError
        if self._data is None:
            self._data = json.loads(self._json)
        return self._data

    def data_json(self) -> str:
        """The result's data as JSON text, as a saved file holds it."""
        if self._rust is None:
            return _dumps(self.to_data())
        return self._json

    # -- rendering ------------------------------------------------------------------------

    def render(self, format: str = "text", **view: Any) -> str:
        """The result in ``format`` (``text``, ``html``, ...: what the kind has), with the
        view's options (``func``, ``columns``, ...) where the kind takes them."""
        if format not in self._formats:
            have = ", ".join(self._formats)
            raise ValueError(f"format={format!r}: a {self.kind} result renders as {have}")
        return self._rust.render(self._json, format, self._view_json(view, format))

    def _view_json(self, view: dict[str, Any], format: str | None = None) -> str:
        """The view's options as the JSON object the room's ``render`` reads for ``format``;
        a kind whose options need checking or completing (a function given for its name,
        the device a column error names, what a format shows when the view does not say)
        says so here."""
        return _dumps(view)

    def text(self) -> str:
        return self.render("text")

    def html(self) -> str:
        if "html" not in self._formats:
            raise NotImplementedError
        return self.render("html")

    def save(self, path: str | os.PathLike[str]) -> None:
        """Save to a result file (``memlab_rs.load`` reads it; ``.gz`` compresses), whole or
        not at all: a failed save (a full disk, a killed process) leaves the file that was
        there."""
        save(self, path)

    def _repr_html_(self) -> str | None:
        try:
            return self.html()
        except NotImplementedError:  # no HTML form: Jupyter shows the text
            return None

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return self.text()


#: The older name of the base class.
SavedResult = Result


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
