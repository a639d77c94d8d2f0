"""docs/calibration.md is reproducible: the rows cheap enough for the test suite are simulated
again and must give the figure the table prints (bench/calibration.py wrote it)."""

import sys

import pytest

from repo import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from calibration import ROWS, simulated  # noqa: E402

TABLE = (ROOT / "docs" / "calibration.md").read_text()


def test_the_table_has_at_least_eight_rows_and_its_median():
    rows = [line for line in TABLE.splitlines() if line.startswith("| ") and not line.startswith("| source")]
    assert len(rows) >= 8
    assert "Median absolute error" in TABLE


@pytest.mark.parametrize("row", [r for r in ROWS if r.small], ids=lambda r: r.configuration)
def test_small_rows_reproduce_their_simulated_figure(row):
    line = next(line for line in TABLE.splitlines() if f"| {row.configuration} |" in line)
    assert f"| {simulated(row):.2f} {row.unit} |" in line
