"""The resource pre-check: its op count is the program's, and a run that would not fit is refused
in one line, exit 2, before anything is built or written."""

import time

import pytest

from clustersim.sim.build import program_of
from clustersim.sim.cli import main
from clustersim.sim.preflight import BASE_BYTES, BYTES_PER_OP, estimate
from clustersim.sim.scenario.loader import load_scenarios

from repo import QUICKSTART, SCENARIOS

SMALL = [s for path in sorted(SCENARIOS.rglob("*.yaml")) for s in load_scenarios(path) if s.num_gpus <= 64]


@pytest.mark.parametrize("scenario", SMALL, ids=lambda s: s.name)
def test_estimated_ops_are_the_programs(scenario):
    """Counted from four tiny programs, extrapolated in microbatches and layers: exact where the op
    count is affine in both; data parallelism's gradient buckets (whole buckets per stage, a ceiling
    of the stage's bytes) are not, so there it is within 5% either way."""
    real = sum(len(ops) for ops in program_of(scenario).ops.values())
    est = estimate(scenario)
    if scenario.parallel.dp > 1:
        assert abs(est.ops - real) <= 0.05 * real
    else:
        assert est.ops == real
    assert est.bytes == BASE_BYTES + est.ops * BYTES_PER_OP


def huge(tmp_path, batch: int):
    path = tmp_path / "huge.yaml"
    path.write_text(QUICKSTART.read_text().replace("global_batch: 32 ", f"global_batch: {batch} "))
    return path


def test_a_run_too_big_for_the_limit_is_refused_before_building(tmp_path, capsys):
    """10^6 microbatches of 4 pipeline stages: 2 x 10^7 ops, tens of GB; refused in well under the
    time building them would take, naming the estimate, the limit and what to change."""
    out = tmp_path / "out"
    start = time.perf_counter()
    assert main(["run", str(huge(tmp_path, 4_000_000)), "-o", str(out), "--max-memory", "4GB"]) == 2
    assert time.perf_counter() - start < 30
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "1,000,000 microbatches" in err and "over the limit of 4 GB" in err and "--max-memory" in err
    assert not out.exists()


def test_max_memory_lets_a_run_through(tmp_path, capsys):
    out = tmp_path / "out"
    path = huge(tmp_path, 32 * 4)  # 32 microbatches: a few hundred ops
    assert main(["run", str(path), "-o", str(out), "--outputs", "summary.json", "--max-memory", "1GB"]) == 0
    assert main(["run", str(path), "-o", str(out), "--max-memory", "1MB"]) == 2
    assert "over the limit of 0.001 GB" in capsys.readouterr().err


def test_max_memory_needs_a_size(tmp_path, capsys):
    assert main(["run", str(QUICKSTART), "-o", str(tmp_path / "o"), "--max-memory", "lots"]) == 2
    assert "--max-memory: 'lots' is not a size in bytes" in capsys.readouterr().err
