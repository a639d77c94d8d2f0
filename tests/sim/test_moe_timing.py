"""MoE layers in the timed program: expert parallelism's all-to-alls (dispatch and combine, each
way), their volume, their time against the collective benchmark, and the experts' gradients
reduced among the ranks that hold the same experts. With numerics off tokens are routed evenly,
so every rank sends (ep - 1)/ep of its routed rows."""

import pytest

from clustersim.schedules.ir import Collective
from clustersim.schedules.tags import GradBucket, GradSync
from clustersim.sim.build import make_program
from clustersim.sim.collectives.run import time_collective
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario_text

SCENARIO = """
name: moe
cluster: {{gpu: H100-SXM, nodes: 1, gpus_per_node: {gpus}, topology: {{kind: switch, link_bandwidth: 450GB/s,
          link_latency: 1us}}}}
model: {{layers: 4, hidden: 1024, heads: 16, ffn: 4096, seq_len: 1024, vocab: 32000,
        moe: {{experts: 8, top_k: 2, every: {every}, expert_ffn: 2048}}}}
training: {{global_batch: {global_batch}, micro_batch: 1, dtype: bf16}}
parallel: {{pp: 1, dp: {dp}, ep: {ep}, zero: 0, bucket: 1GB}}
numerics: {{enabled: false}}
"""
H, S, K, BF16 = 1024, 1024, 2, 2
ROUTED = S * K * H * BF16  # one rank's dispatch buffer: its s x b tokens, k rows each, h wide


def run(dp: int, ep: int, every: int = 1, m: int = 2, exact: bool = False):
    text = SCENARIO.format(gpus=dp, dp=dp, ep=ep, every=every, global_batch=m * dp)
    return simulate(load_scenario_text(text, "moe.yaml"), exact=exact)


@pytest.mark.parametrize("ep,every", [(2, 1), (4, 1), (4, 2)])
def test_each_moe_layer_sends_four_all_to_alls_of_tokens_and_one_of_counts_each_microbatch(ep, every):
    """Dispatch and combine each way move the routed rows; before the dispatch every rank tells the
    others how many rows per expert are coming: one int64 per expert."""
    m, moe_layers, experts = 2, 4 // every, 8
    summary = run(dp=4, ep=ep, every=every, m=m).summary
    for rank in range(4):
        sent = summary["comm_bytes_sent_per_rank"][str(rank)]["ep"]
        assert sent == pytest.approx(m * moe_layers * (ep - 1) / ep * (4 * ROUTED + experts * 8), rel=1e-9)


def test_an_evenly_routed_all_to_all_takes_what_the_collective_benchmark_says():
    """Acceptance: with a uniform router the simulated all-to-all equals the benchmark's within 2%."""
    result = run(dp=4, ep=4, m=1, exact=True)
    spans = [s for s in result.log.spans if s.phase == "ALL_TO_ALL" and s.rank == 0 and s.nbytes == ROUTED]
    alone, _ = time_collective(result.graph, "all_to_all", "auto", [0, 1, 2, 3], ROUTED)
    assert spans and all(s.duration_s == pytest.approx(alone, rel=0.02) for s in spans)


def test_expert_gradients_are_reduced_among_the_ranks_holding_the_same_experts():
    """dp 4, ep 2: the dense gradients over all 4 ranks, each expert's over the 2 that hold it (ring
    all-reduce sends 2 (N - 1)/N of the buffer)."""
    summary = run(dp=4, ep=2).summary
    h, f, e, layers = H, 2048, 8, 4
    expert = (2 * h * f + f + h) * e // 2 * layers * BF16  # the 4 experts a rank holds, every layer
    total = summary["memory_peak_bytes_per_rank"]["0"]["weights"]  # 16-bit weights of the rank
    dense = total - expert
    sent = summary["comm_bytes_sent_per_rank"]["0"]["dp"]
    assert sent == pytest.approx(2 * 3 / 4 * dense + 2 * 1 / 2 * expert, rel=1e-9)


def test_tensor_parallelism_splits_the_tokens_and_sums_the_whole_experts_gradients_over_tp():
    """dp 4, ep 2, tp 2: each tensor-parallel rank routes half of a microbatch's tokens through
    whole experts, so before the step the tp pair sums its gradients of every MoE layer's router
    and of its 4 experts; the experts' are then reduced between the 2 ranks holding them, whole."""
    text = SCENARIO.format(gpus=8, dp=4, ep=2, every=1, global_batch=8).replace("ep: 2,", "ep: 2, tp: 2,")
    program = make_program(load_scenario_text(text, "moe.yaml"))
    sizes = {op.tag: op.nbytes for op in program.ops[0] if isinstance(op, Collective)}
    h, f, e, layers = H, 2048, 8, 4
    expert = (2 * h * f + f + h) * e // 2 * layers * BF16  # 134_316_032: the 4 experts, every layer, not split
    router = h * e * layers * BF16  # 65_536
    assert sizes[GradSync(replica=0, stage=0)] == expert + router  # 134_381_568
    assert sizes[GradBucket(stage=0, tp_rank=0, bucket=0, expert_rank=0)] == expert
