"""Where the repository's files are, for tests at any depth of tests/ (importable because
tests/conftest.py puts tests/ on sys.path)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
QUICKSTART = SCENARIOS / "quickstart.yaml"
