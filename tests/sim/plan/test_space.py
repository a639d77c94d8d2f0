"""The planner's candidates: only scenarios the loader accepts, pruned by the divisibility rules,
every registered schedule considered; the sweep's --set parsing."""

import pytest

from clustersim.schedules.pipeline import SCHEDULES
from clustersim.sim.plan.space import candidate_key, parse_set, scenario_of, strategies, valid_candidates
from clustersim.sim.scenario.errors import ScenarioError
from clustersim.sim.scenario.loader import load_scenario, scenario_data


def test_rejects_tp_not_dividing_heads(small):
    """tp 8 divides the 8 GPUs but not the 12 heads: it never appears; 1, 2 and 4 do."""
    data, base = scenario_data(small), load_scenario(small)
    kept, _ = valid_candidates(data, base, small)
    assert {o["parallel.tp"] for o, _ in kept} == {1, 2, 4}
    assert all(12 % o["parallel.tp"] == 0 for o in strategies(base))


def test_every_candidate_is_a_scenario_the_loader_accepts(small):
    data, base = scenario_data(small), load_scenario(small)
    kept, refused = valid_candidates(data, base, small)
    assert kept and refused == 0  # the enumeration proposes only values that can pass
    for overrides, scenario in kept:
        p = scenario.parallel
        assert p.tp * p.pp * p.dp == 8
        assert 8 % p.num_stages == 0  # pp x virtual divides the layers
        assert 16 % (scenario.training.micro_batch * p.dp) == 0
        assert scenario_of(data, overrides, small) == scenario


def test_every_registered_schedule_is_considered(small):
    """The schedules come from the registry: a new entry joins without touching the planner."""
    data, base = scenario_data(small), load_scenario(small)
    kept, _ = valid_candidates(data, base, small)
    assert {o["schedule"] for o, _ in kept} == set(SCHEDULES)
    assert {o["parallel.virtual"] for o, _ in kept if not SCHEDULES[o["schedule"]].chunks_per_rank} == {1}


def test_candidate_key_is_stable_and_tells_candidates_apart(small):
    data = scenario_data(small)
    a = {"parallel.tp": 2, "parallel.dp": 2}
    assert candidate_key(data, a) == candidate_key(scenario_data(small), dict(a))
    assert candidate_key(data, a) != candidate_key(data, {"parallel.tp": 4, "parallel.dp": 1})


def test_parse_set_reads_values_as_yaml():
    assert parse_set("parallel.tp=1,2,4") == ("parallel.tp", [1, 2, 4])
    assert parse_set("parallel.sequence_parallel=true,false")[1] == [True, False]
    assert parse_set("parallel.order=[dp,pp,tp],[pp,dp,tp]")[1] == [["dp", "pp", "tp"], ["pp", "dp", "tp"]]
    with pytest.raises(ScenarioError, match="--set: expected PATH=VALUE"):
        parse_set("parallel.tp")


def test_top_diverse_spreads_the_simulations_over_shapes():
    """One per shape (tp, pp, ep, schedule, ZeRO) first, by estimate; then the next best."""
    from clustersim.sim.plan.commands import top_diverse

    def cand(tp, v):
        return {
            "parallel.tp": tp,
            "parallel.pp": 2,
            "parallel.ep": 1,
            "schedule": "interleaved",
            "parallel.zero": 1,
        } | {"parallel.virtual": v}

    ranked = [(1.0, cand(8, 2)), (1.1, cand(8, 4)), (1.2, cand(8, 8)), (1.3, cand(4, 2)), (1.4, cand(2, 2))]
    assert top_diverse(ranked, 3) == [ranked[0], ranked[3], ranked[4]]
    assert top_diverse(ranked, 4) == [ranked[0], ranked[1], ranked[3], ranked[4]]
