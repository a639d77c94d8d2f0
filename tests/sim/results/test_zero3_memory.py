"""ZeRO 3's weights over a run: a rank holds its shard, 2 Psi / N (the ZeRO paper's P_os+g+p), plus
at most prefetch + 1 gathered units (schedules.zero3): the simulated peak of memory.png's "weights"
equals that closed form, from the units' sizes alone."""

import pytest

from clustersim.schedules.ir import Collective
from clustersim.schedules.zero3 import STREAM
from clustersim.sim.cost.memory import model_state_bytes
from clustersim.sim.cost.stages import stage_params, weight_bytes
from clustersim.sim.cost.units import peak_gathered_bytes, stage_units, unit_weight_bytes
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario_text

SCENARIO = """
name: zero3_units
cluster: {{gpu: A100-SXM-80GB, nodes: 1, gpus_per_node: {gpus},
           topology: {{kind: switch, link_bandwidth: 300GB/s, link_latency: 1us}}}}
model: {{layers: 6, hidden: 1024, heads: 16, ffn: 4096, seq_len: 1024, vocab: 32000}}
training: {{global_batch: {batch}, micro_batch: 1, dtype: bf16, recompute: {recompute}}}
parallel: {{tp: {tp}, pp: 3, dp: 2, zero: 3, zero3_unit_layers: {unit}, zero3_prefetch: {prefetch}}}
schedule: 1f1b
numerics: {{enabled: false}}
"""


def run(unit: int, prefetch: int, tp: int = 1, recompute: str = "none"):
    text = SCENARIO.format(gpus=6 * tp, batch=8, recompute=recompute, tp=tp, unit=unit, prefetch=prefetch)
    return simulate(load_scenario_text(text, "zero3_units.yaml"))


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_the_middle_stages_peak_is_its_shard_plus_prefetch_plus_one_units(prefetch):
    """Stage 1 (layers 2, 3; no embedding or head) in units of one layer: equal units of w bytes."""
    result = run(unit=1, prefetch=prefetch)
    scenario, rank = result.scenario, result.program.stage_to_rank[1]
    shard = model_state_bytes(stage_params(scenario, 1), 3, 2)["weights"]
    w = unit_weight_bytes(scenario, 1, 0)
    assert w == unit_weight_bytes(scenario, 1, 1) and 2 * w == pytest.approx(weight_bytes(scenario, 1), rel=1e-12)
    peak = result.summary["memory_peak_bytes_per_rank"][str(rank)]["weights"]
    assert peak == shard + (prefetch + 1) * w


@pytest.mark.parametrize("unit,prefetch,tp,recompute", [(1, 1, 1, "none"), (2, 1, 2, "full"), (1, 2, 2, "selective")])
def test_every_ranks_peak_is_its_shard_plus_its_largest_window_of_units(unit, prefetch, tp, recompute):
    """Stages 0 and 2 carry the embedding and the head in their first and last units: the peak
    is the shard plus the largest prefetch + 1 consecutive units the rank uses."""
    result = run(unit, prefetch, tp, recompute)
    scenario, peaks = result.scenario, result.summary["memory_peak_bytes_per_rank"]
    for stage, rank in result.program.stage_to_rank.items():
        uses = [
            op.tag.unit
            for op in result.program.ops[rank]
            if isinstance(op, Collective) and op.kind == "all_gather" and op.stream == STREAM
        ]
        assert len(uses) == 2 * 8 // 2 * len(stage_units(scenario, stage))  # 2 per microbatch and unit
        shard = model_state_bytes(stage_params(scenario, stage), 3, 2)["weights"]
        expected = shard + peak_gathered_bytes([unit_weight_bytes(scenario, stage, u) for u in uses], prefetch)
        assert peaks[str(rank)]["weights"] == pytest.approx(expected, rel=1e-12), stage
