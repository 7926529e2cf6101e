"""A timeline view checked once, by the rules both pictures share, and drawn as HTML.

A view is what ``TraceResult.timeline(device)`` returns, or a dict made by hand with its
keys (``title``, ``time_us``, ``total``, ``layers``, ``peak_index``, ``peak_bytes``,
``notices``; lists, tuples or NumPy arrays). It crosses to Rust as JSON, where its serde
derive reads it (``_core.trace.timeline_view``): a missing key or lengths that disagree are
a ValueError, a value of the wrong type a TypeError naming its key. The HTML page is drawn
there (``_core.trace.timeline_html``); the PNG (``plots``) draws the same checked view.

>>> page = timeline_html({"title": "cpu", "time_us": [0, 1000, 2000],
...     "total": [0, 1 << 20, 0], "layers": [("model.py:3 (f)", [0, 1 << 20, 0])],
...     "peak_index": 1, "peak_bytes": 1 << 20, "notices": []})
>>> "peak 1.0 MiB (1048576 bytes)" in page
True
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .. import _core


def _plain(value: Any) -> Any:
    """A value JSON has no form for, as one: a NumPy array or number as its list or number,
    any other sequence (a range) as a list."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return list(value)
    raise TypeError(
        f"the timeline view holds {value!r:.60} ({type(value).__name__}): its values are "
        "ints, str and lists of them, as report.timeline(device) returns"
    )


def view_json(view: Any) -> str:
    """``view`` (a dict) as the JSON text Rust reads."""
    if not isinstance(view, Mapping):
        raise TypeError(
            f"expected the timeline dict (report.timeline(device)), got {type(view).__name__}"
        )
    try:
        return json.dumps(dict(view), default=_plain, allow_nan=False, separators=(",", ":"))
    except ValueError:  # NaN or infinity: not a byte count or a time
        raise TypeError(
            "the timeline view holds NaN or infinity: its values are ints (byte counts and "
            "microseconds)"
        ) from None


def checked(view: Any) -> dict[str, Any]:
    """``view`` as the renderers draw it: plain lists, ``title`` and ``notices`` filled in;
    a ValueError or TypeError naming what is wrong."""
    return json.loads(_core.trace.timeline_view(view_json(view)))


def timeline_html(view: Any) -> str:
    """The timeline as one self-contained HTML page (no network needed to open it)."""
    return _core.trace.timeline_html(view_json(view))
