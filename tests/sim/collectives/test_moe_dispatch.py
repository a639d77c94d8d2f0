"""The flex MoE exchange (DeepEP, HybridEP): a token crosses to a remote node once and fans out over
NVLink there. Its fan-out odds by counting, its bytes on the per-link ledger against the
alltoall dispatcher's, the data it moves, and the scenario's switch."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import simpy

from clustersim.sim.collectives import moe_dispatch, nccl
from clustersim.sim.collectives.run import apply_collective, run_collective
from clustersim.sim.collectives.steps import CollectiveError
from clustersim.sim.network.network import Network
from clustersim.sim.scenario.loader import load_scenario_text
from clustersim.sim.scenario.schema import ScenarioError
from clustersim.sim.scenario.spec import parse_spec

GiB = 2**30
TWO_H100_NODES = "fattree:nodes=2,gpus_per_node=8"


def test_the_odds_a_token_needs_a_gpu_are_counted_over_its_expert_choices():
    hit = lambda k, e, held: moe_dispatch.Routing(k, e).hit_probability(range(held))  # noqa: E731
    # one expert per token: the share of experts held
    assert hit(1, 128, 8) == pytest.approx(8 / 128)
    # all experts held, or every expert chosen: certain; none held: never
    assert hit(8, 128, 128) == 1.0 == hit(16, 16, 1)
    assert hit(8, 128, 0) == 0.0
    # 8 of 128 avoiding 8 held ones: the product of 120/128 ... 113/121
    avoid = math.prod((120 - i) / (128 - i) for i in range(8))
    assert hit(8, 128, 8) == pytest.approx(1 - avoid, rel=1e-12)


def test_node_limited_routing_sends_fewer_tokens_to_each_node():
    """DeepSeek-V3's 256 experts in 8 groups, a token's 8 within its best 4 (one group a node): a
    node is among a token's 4 groups half the time, and then holds 32 of the 128 it picks from."""
    limited = moe_dispatch.Routing(8, 256, 8, 4)
    node = range(32, 64)  # group 1 whole
    assert limited.hit_probability(node) == pytest.approx(0.5 * (1 - math.comb(96, 8) / math.comb(128, 8)))
    anywhere = moe_dispatch.Routing(8, 256, 8, 8)
    assert anywhere.hit_probability(node) == pytest.approx(1 - math.comb(224, 8) / math.comb(256, 8))
    assert anywhere.hit_probability(node) == moe_dispatch.Routing(8, 256).hit_probability(node)
    # a GPU's 4 experts inside one group: that group chosen, then one of its 4 among the 128
    gpu = range(36, 40)
    assert limited.hit_probability(gpu) == pytest.approx(0.5 * (1 - math.comb(124, 8) / math.comb(128, 8)))
    # experts straddling two groups: every choice of 4 groups counted, here by brute force
    straddle = list(range(30, 34))
    counted = [
        1 - math.comb(128 - sum(e // 32 in chosen for e in straddle), 8) / math.comb(128, 8)
        for chosen in itertools.combinations(range(8), 4)
    ]
    assert limited.hit_probability(straddle) == pytest.approx(sum(counted) / len(counted), rel=1e-12)


def test_names_carry_the_routing():
    routing = moe_dispatch.Routing(8, 256, 8, 4)
    assert routing.name == "flex:8/256/8/4" and moe_dispatch.parse(routing.name) == routing
    assert moe_dispatch.parse("pxn") is None
    with pytest.raises(CollectiveError, match="is not a routing"):
        moe_dispatch.parse("flex:9/8/1/1")
    with pytest.raises(CollectiveError, match="expected flex:TOP_K/EXPERTS/GROUPS/LIMITED"):
        moe_dispatch.parse("flex:8/128")


def _loads(algo: str, nbytes: float) -> dict[str, float]:
    graph = parse_spec(TWO_H100_NODES)
    graph.graph[nccl.NCCL] = nccl.NcclConfig("H100")
    env = simpy.Environment()
    network = Network(env, graph)
    env.run(until=env.process(run_collective(network, "all_to_all", algo, range(16), None, nbytes)))
    return dict(zip(network.link_names, network.ledger.link_totals()[0]))


def test_a_token_crosses_to_the_other_node_once_not_once_per_expert():
    """Qwen3-30B-A3B's routing over 16 GPUs on 2 nodes: each GPU's send buffer S holds T k rows.
    The alltoall dispatcher sends the other node's 8 GPUs S / 16 each, S / 2 through the NICs; flex
    sends each token there once, S / 8 x P(one of its 8 experts is among that node's 64)."""
    S = GiB
    flex = _loads(moe_dispatch.Routing(8, 128).name, S)
    pxn = _loads("pxn", S)
    nic = lambda loads, g: loads[f"gpu{g}->nic{g}"]  # noqa: E731
    # the bytes on the wire over the bytes sent: NCCL's protocol on the NIC (the same for both)
    wire = nic(pxn, 0) / (S / 2)
    assert 1.0 < wire < 1.2
    p_node = moe_dispatch.Routing(8, 128).hit_probability(range(64, 128))
    assert nic(flex, 0) == pytest.approx(S / 8 * p_node * wire, rel=1e-12)
    assert all(nic(flex, g) == pytest.approx(nic(flex, 0)) for g in range(16))  # every rail alike
    assert nic(pxn, 0) / nic(flex, 0) == pytest.approx(4 / p_node)


def test_the_flex_exchange_moves_the_all_to_alls_data():
    rng = np.random.default_rng(0)
    graph = parse_spec(TWO_H100_NODES)
    graph.graph[nccl.NCCL] = nccl.NcclConfig("H100")
    buffers = [rng.standard_normal(32) for _ in range(16)]
    flex = apply_collective(graph, "all_to_all", "flex:8/128/1/1", list(range(16)), buffers, 2**20)
    direct = apply_collective(graph, "all_to_all", "direct", list(range(16)), buffers, 2**20)
    for a, b in zip(flex, direct):
        np.testing.assert_array_equal(a, b)


SCENARIO = """\
name: experts
cluster:
  gpu: H100-SXM
  nodes: 2
  gpus_per_node: 8
  topology: {kind: fattree, nvlink_bandwidth: 450GB/s, nic_bandwidth: 50GB/s, leaf_radix: 32, link_latency: 1us}
  nccl: {}
model: {layers: 2, hidden: 512, heads: 8, ffn: 1024, seq_len: 256, vocab: 1000, gated_mlp: true,
        moe: {experts: 64, top_k: 8, expert_ffn: 256}}
training: {global_batch: 16, micro_batch: 1}
parallel: {dp: 16, ep: 16, megatron: {moe_dispatcher: flex}}
schedule: 1f1b
numerics: {enabled: false}
"""


def test_the_scenario_switch_sends_fewer_bytes_and_checks_its_needs():
    from clustersim.sim.plan.estimate import estimate, fabric_of
    from clustersim.sim.run import simulate

    scenarios = [load_scenario_text(SCENARIO.replace("flex", dispatcher)) for dispatcher in ("flex", "alltoall")]
    flex, alltoall = (simulate(scenario).summary for scenario in scenarios)
    assert flex["alltoall_bytes_total"] < alltoall["alltoall_bytes_total"]
    assert flex["step_time_s"] < alltoall["step_time_s"]
    # the planner's estimate times the same exchange
    planned = [estimate(scenario, fabric_of(scenario)).step_time_s for scenario in scenarios]
    assert planned[0] < planned[1]
    with pytest.raises(ScenarioError, match="moe_dispatcher: flex needs the NCCL layer"):
        load_scenario_text(SCENARIO.replace("  nccl: {}\n", ""))
    dense = SCENARIO.replace(",\n        moe: {experts: 64, top_k: 8, expert_ffn: 256}}", "}").replace(", ep: 16", "")
    with pytest.raises(ScenarioError, match="moe_dispatcher: needs an MoE model"):
        load_scenario_text(dense)
