"""Every bundled scenario (each variant of a file with variants) opens with the question it
answers, runs, and proves its numerics. Big ones (more than 32 GPUs) run in a reduced mode: the
fewest microbatches their schedule allows (pp for interleaved, 1 otherwise), same cluster, model
and layout. Production-size ones (more than 1,024 GPUs) are bench/scale.py's to run: here their
program of representatives is built and validated."""

import pytest

from clustersim.sim.build import make_program, symmetry_of
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenarios

from golden_summaries import BENCH_ONLY_GPUS, reduced
from repo import SCENARIOS as SCENARIOS_DIR

SCENARIOS = sorted(SCENARIOS_DIR.glob("*.yaml"))


def test_there_are_scenarios():
    assert SCENARIOS


SLOW = {"gpt3_175b_ptdp", "gpt3_175b_1024", "llama3_405b_16k"}  # seconds each, even reduced


@pytest.mark.parametrize(
    "path", [pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if p.stem in SLOW else []) for p in SCENARIOS]
)
def test_bundled_scenario_runs_and_matches_one_device(path):
    assert path.read_text().startswith("# "), "a scenario opens with a comment saying what it answers"
    for scenario in map(reduced, load_scenarios(path)):
        if scenario.num_gpus > BENCH_ONLY_GPUS:
            program = make_program(scenario, symmetry_of(scenario).representatives)
            assert len(program.ranks) == scenario.parallel.pp  # one rank per stage stands for the rest
            continue
        summary = simulate(scenario).summary
        assert summary["step_time_s"] > 0
        if scenario.numerics.enabled:
            assert summary["numerics_max_rel_err"] < 1e-10
        assert not summary["memory_over_capacity_ranks"]
