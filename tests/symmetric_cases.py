"""Mid-size scenarios (64-256 GPUs; dense and MoE; fat trees and a torus) where the fast paths
(replayed collectives, one rank per orbit) really apply, for the tests that compare them with the
exact path (tests/sim/scale/) and the engine's determinism tests."""

from clustersim.sim.scenario.loader import load_scenario_text

SCENARIO = """
name: shortcut
cluster: {{gpu: H100-SXM, nodes: {nodes}, gpus_per_node: {per_node}, topology: {topology}}}
model: {{layers: 8, hidden: 2048, heads: 16, ffn: 8192, seq_len: 1024, vocab: 32000}}
training: {{global_batch: {global_batch}, micro_batch: 1, dtype: bf16, recompute: selective}}
parallel: {{tp: {tp}, pp: {pp}, dp: {dp}, virtual: {virtual}, zero: 1, sequence_parallel: true, bucket: 64MB}}
schedule: {schedule}
numerics: {{enabled: false}}
"""
FATTREE = "{kind: fattree, leaf_radix: 16, load_balance: adaptive, link_latency: 1us}"
FATTREE_ECMP = "{kind: fattree, leaf_radix: 8, oversubscription: 2, load_balance: ecmp, link_latency: 1us}"
TORUS = "{kind: torus, axes: [4, 4, 4], link_bandwidth: 100GB/s, link_latency: 1us}"

MOE_MODEL = (
    "{layers: 4, hidden: 2048, heads: 16, ffn: 8192, seq_len: 1024, vocab: 32000, "
    "moe: {experts: 16, top_k: 2, expert_ffn: 2048}}"
)

CASES = {
    # (nodes, gpus per node, topology, tp, pp, dp, schedule, virtual, microbatches per replica[, MoE model, ep])
    "fattree-64-interleaved": (8, 8, FATTREE, 8, 4, 2, "interleaved", 2, 4),
    "fattree-128-1f1b": (16, 8, FATTREE, 8, 4, 4, "1f1b", 1, 4),
    "fattree-ecmp-oversubscribed-64": (8, 8, FATTREE_ECMP, 4, 4, 4, "gpipe", 1, 2),
    "fattree-256-1f1b": (32, 8, FATTREE, 8, 4, 8, "1f1b", 1, 4),
    "torus-64": (16, 4, TORUS, 4, 4, 4, "1f1b", 1, 2),
    # MoE: expert-parallel all-to-alls across replicas next to the tensor-parallel groups' replays
    "moe-fattree-64": (8, 8, FATTREE, 8, 2, 4, "1f1b", 1, 2, MOE_MODEL, 4),
    "moe-torus-64": (16, 4, TORUS, 4, 2, 8, "1f1b", 1, 2, MOE_MODEL, 8),
}


def scenario(case: str):
    nodes, per_node, topology, tp, pp, dp, schedule, virtual, m, *moe = CASES[case]
    text = SCENARIO.format(
        nodes=nodes,
        per_node=per_node,
        topology=topology,
        tp=tp,
        pp=pp,
        dp=dp,
        global_batch=m * dp,
        schedule=schedule,
        virtual=virtual,
    )
    if moe:  # an MoE model, expert-parallel over `ep` replicas, ZeRO 1 as the dense cases
        model, ep = moe
        text = text.replace(text[text.index("model: ") : text.index("\ntraining")], f"model: {model}")
        text = text.replace("zero: 1,", f"zero: 1, ep: {ep},")
    return load_scenario_text(text, f"{case}.yaml")
