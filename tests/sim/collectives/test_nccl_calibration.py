"""docs/calibration.md's collectives section is reproducible and within its stated bounds: every
fast row of bench/nccl_tests.py is simulated again; its error against the published nccl-tests
figure (the source is in the row) must stay within the row's bound, and the table must print it.
The full sweeps (every size of the published tables, no bound) must be printed as they come out, and
carry the same published figures as the rows taken from the same tables."""

import statistics
import sys

import pytest

from repo import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from nccl_tests import ROWS, SWEEP_SIZES, SWEEPS, error, simulated, sweep_table  # noqa: E402

TABLE = (ROOT / "docs" / "calibration.md").read_text()


@pytest.mark.parametrize("row", [r for r in ROWS if r.small], ids=lambda r: r.configuration)
def test_row_within_its_bound_and_as_the_table_prints_it(row):
    busbw, algo, protocol = simulated(row)
    assert abs(error(row, busbw)) <= row.bound
    acceptance = 0.05 if row.size >= 256 * 2**20 else 0.15  # issue 15: 5% at >= 256 MiB, 15% below
    assert row.bound <= acceptance or row.why  # a looser bound says what the model lacks
    line = next(line for line in TABLE.splitlines() if line.startswith(f"| {row.source} | {row.configuration} |"))
    assert f"| {algo}/{protocol} | {row.published_GBps:.2f} GB/s | {busbw:.2f} GB/s |" in line


def test_at_least_12_rows_from_3_sources_with_median_error_at_most_5_percent():
    assert len(ROWS) >= 12
    assert len({row.source.split(",")[0].split(":")[0] for row in ROWS}) >= 3
    assert statistics.median(abs(error(row, simulated(row)[0])) for row in ROWS) <= 0.05


@pytest.mark.parametrize("key", list(SWEEPS), ids=lambda key: f"{key[1]}, {key[0].split(',')[0]}")
def test_sweep_is_printed_as_it_comes_out_and_agrees_with_the_rows_from_its_table(key):
    source, system, algo = key
    assert sweep_table(source, system, algo) in TABLE
    rows = [
        r
        for r in ROWS
        if r.source.startswith(source) and r.system == system and r.algo == algo and r.op == "all_reduce"
    ]
    assert rows  # every sweep is a table some rows come from
    for row in rows:
        assert SWEEPS[key][SWEEP_SIZES.index(row.size)] == row.published_GBps
