"""Where the tests' files are: the tests folder, its fixtures, the repository's root."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
FIXTURES = TESTS / "fixtures"
ROOT = TESTS.parent
