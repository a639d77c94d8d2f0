"""An uneven split of the layers over the pipeline stages (parallel.stage_layers), as Megatron-Core's
pipeline_model_parallel_layout makes one: the loader's rule, the stages' layers and FLOPs, the
shadow model still equal to one device, and what it is for: a lighter last stage next to the head."""

import pytest

from clustersim.sim.cost.stages import stage_forward_flops, stage_layer_range
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario_text
from clustersim.sim.scenario.schema import ScenarioError

SCENARIO = """\
name: uneven
cluster:
  gpu: A100-SXM-80GB
  gpus_per_node: 4
  topology: {kind: switch, link_bandwidth: 300GB/s, link_latency: 1us}
model: {layers: 7, hidden: 256, heads: 4, ffn: 1024, seq_len: 128, vocab: 50000}
training: {global_batch: 8, micro_batch: 1}
parallel: {pp: 4, stage_layers: [2, 2, 2, 1]}
schedule: 1f1b
numerics: {enabled: true, hidden: 8, heads: 2, seq_len: 4, vocab: 16}
"""


def test_the_split_must_give_each_stage_its_layers():
    with pytest.raises(ScenarioError, match=r"parallel\.stage_layers: 3 stages of 7 layers: give one count per stage"):
        load_scenario_text(SCENARIO.replace("[2, 2, 2, 1]", "[3, 3, 1]"))
    with pytest.raises(ScenarioError, match=r"parallel\.stage_layers: 4 stages of 8 layers"):
        load_scenario_text(SCENARIO.replace("[2, 2, 2, 1]", "[2, 2, 2, 2]"))
    with pytest.raises(ScenarioError, match=r"parallel\.pp: 4 does not divide model\.layers \(7\)"):
        load_scenario_text(SCENARIO.replace(", stage_layers: [2, 2, 2, 1]", ""))


def test_each_stage_runs_its_own_layers_and_their_flops():
    scenario = load_scenario_text(SCENARIO)
    assert [list(stage_layer_range(scenario, s)) for s in range(4)] == [[0, 1], [2, 3], [4, 5], [6]]
    flops = [stage_forward_flops(scenario, s) for s in range(4)]
    layer = flops[1] / 2  # a middle stage: two layers, nothing else
    assert flops[2] == pytest.approx(2 * layer, rel=1e-12)
    # the last stage: one layer and the LM head (2 b s h V)
    assert flops[3] == pytest.approx(layer + 2 * 128 * 256 * 50000, rel=1e-12)


def test_the_shadow_model_still_matches_one_device():
    summary = simulate(load_scenario_text(SCENARIO)).summary
    assert summary["numerics_max_rel_err"] < 1e-10


def test_a_lighter_last_stage_shortens_a_step_its_head_paces():
    """With a 50k vocabulary the head costs more than a layer here: one layer fewer on the last
    stage, one more on the first, and the pipeline's slowest stage gets faster."""
    base = SCENARIO.replace("layers: 7", "layers: 8").replace("numerics: {enabled: true", "numerics: {enabled: false")
    even = simulate(load_scenario_text(base.replace(", stage_layers: [2, 2, 2, 1]", ""))).summary
    uneven = simulate(load_scenario_text(base.replace("[2, 2, 2, 1]", "[3, 2, 2, 1]"))).summary
    assert uneven["step_time_s"] < even["step_time_s"]


def test_the_memory_preflight_sizes_a_run_with_an_uneven_split():
    """The preflight times small programs of a few whole layers per stage: the split is dropped
    there (it raised for a layer past the resized model before)."""
    from clustersim.sim.preflight import estimate

    scenario = load_scenario_text(SCENARIO)
    even = load_scenario_text(SCENARIO.replace("layers: 7", "layers: 8").replace("[2, 2, 2, 1]", "[2, 2, 2, 2]"))
    assert 0 < estimate(scenario).ops <= estimate(even).ops  # one layer fewer: no more ops


def test_the_planner_splits_its_other_stage_counts_evenly(tmp_path):
    """The scenario's split fits its own 4 stages; the planner's strategies with other stage counts
    (here 1: 7 layers leave no other) drop it rather than being refused for it."""
    from clustersim.sim.plan.space import valid_candidates
    from clustersim.sim.scenario.loader import scenario_data

    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.replace("numerics: {enabled: true", "numerics: {enabled: false"))
    kept, _ = valid_candidates(scenario_data(path), load_scenario_text(SCENARIO), str(path))
    assert kept and all(scenario.parallel.stage_layers is None for _, scenario in kept)
