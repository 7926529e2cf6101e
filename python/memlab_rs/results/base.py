"""What every result class shares (``Result``): save, text, HTML, ``str()`` and Jupyter."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from .files import save


class SavedResult:
    """What every result class shares: ``save(path)``, ``str()`` and ``repr()`` as its
    ``text()``, Jupyter's display as its ``html()`` (plain text where it has none).
    Subclasses define ``kind``, ``meta``, ``to_data()`` and ``text()``, and ``html()``
    where they have an HTML form; they override the rest where they differ."""

    kind: ClassVar[str]
    meta: dict[str, Any]

    def to_data(self) -> dict[str, Any]:
        raise NotImplementedError

    def text(self) -> str:
        raise NotImplementedError

    def html(self) -> str:
        raise NotImplementedError

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
