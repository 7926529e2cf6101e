"""The API reference is generated from the docstrings: it must be up to date."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("IPython")

DOCS = Path(__file__).parent.parent / "docs"


def test_api_reference_is_up_to_date():
    spec = importlib.util.spec_from_file_location("gen_api", DOCS / "gen_api.py")
    gen_api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_api)
    assert (DOCS / "api.md").read_text() == gen_api.render(), "run: python docs/gen_api.py"


def test_every_public_name_is_in_the_reference():
    import memlab_rs

    text = (DOCS / "api.md").read_text()
    for name in memlab_rs.__all__:
        assert f"memlab_rs.{name}" in text
