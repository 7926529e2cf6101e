"""A result saved and loaded back, and a damaged one refused: what the saved-result tests of
every kind check (tests/unit/results/test_saved_results.py and the rooms' own)."""

from __future__ import annotations

import gzip
import json

import pytest

import memlab_rs
from memlab_rs import results

#: A result is saved as JSON and as gzip-compressed JSON.
NAMES = ["result.json", "result.json.gz"]


def saved_and_loaded(result, tmp_path, name):
    """``result`` saved to ``tmp_path/name`` and loaded back, after checking the file."""
    path = tmp_path / name
    result.save(path)
    raw = gzip.open(path).read() if name.endswith(".gz") else path.read_bytes()
    doc = json.loads(raw)
    assert (doc["format"], doc["schema"], doc["kind"]) == (results.FORMAT, 1, result.kind)
    loaded = memlab_rs.load(path)
    assert type(loaded) is type(result)
    assert loaded.meta == result.meta
    assert results.dumps(loaded) == results.dumps(result)  # saved again: the same file
    return loaded


def refused(tmp_path, result, damage, message):
    """The result's document, damaged by ``damage(data)``, fails to load with ``message``."""
    doc = json.loads(results.dumps(result))
    damage(doc["data"])
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=message) as err:
        memlab_rs.load(path)
    assert str(err.value).startswith(f"{path}: a damaged {result.kind} result")
