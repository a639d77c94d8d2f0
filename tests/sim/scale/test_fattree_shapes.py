"""Walking representatives (sim.scale.symmetry) on any fat tree gives the exact path's results: over
many shapes (nodes, GPUs per node, leaf radix dividing the node count or not, 2 and 3 tiers,
oversubscription, adaptive or ECMP load balance, tp / pp / dp and rank orders) the run never fails,
and step time, per-rank bubbles, link bytes and bytes per rank agree with `exact=True`; and where
the fabric allows, the symmetric path is really taken."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from clustersim.sim.build import symmetry_of
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario_text

TEXT = """
name: shape
cluster:
  gpu: H100-SXM
  nodes: {nodes}
  gpus_per_node: {per}
  topology: {{kind: fattree, leaf_radix: {radix}, tiers: {tiers}, oversubscription: {over},
             load_balance: {balance}, link_latency: 1us}}
model: {{layers: 12, hidden: 512, heads: 8, ffn: 2048, seq_len: 256, vocab: 1000}}
training: {{global_batch: {batch}, micro_batch: 1, dtype: bf16}}
parallel: {{tp: {tp}, pp: {pp}, dp: {dp}, zero: 1, bucket: 4MB, order: [{order}]}}
schedule: 1f1b
numerics: {{enabled: false}}
"""
ORDERS = ("dp, pp, tp", "pp, dp, tp", "dp, tp, pp")


@st.composite
def shapes(draw, max_nodes: int):
    per = draw(st.sampled_from([1, 2, 4, 8]))
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if t <= per]))
    pp = draw(st.sampled_from([1, 2, 3, 4]))
    dp = draw(st.integers(1, 12))
    world = tp * pp * dp
    if world % per or not 2 <= world // per <= max_nodes:
        reject()
    nodes = world // per
    return {
        "nodes": nodes,
        "per": per,
        "radix": draw(st.integers(1, nodes + 1)),
        "tiers": draw(st.sampled_from([2, 3])),
        "over": draw(st.sampled_from([1, 2, 1.5])),
        "balance": draw(st.sampled_from(["adaptive", "adaptive", "ecmp"])),
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "order": draw(st.sampled_from(ORDERS)),
        "batch": dp * draw(st.sampled_from([1, 2, 3])),
    }


MOE_MODEL = (
    "model: {layers: 12, hidden: 512, heads: 8, ffn: 2048, seq_len: 256, vocab: 1000, moe: {experts: 8, top_k: 2}}"
)


def scenario(shape: dict):
    text = TEXT.format(**{k: v for k, v in shape.items() if k != "ep"})
    if "ep" in shape:  # an MoE model, expert-parallel over `ep` replicas
        text = text.replace(text[text.index("model: ") : text.index("\ntraining")], MOE_MODEL)
        text = text.replace("zero: 1,", f"zero: 1, ep: {shape['ep']},")
    return load_scenario_text(text, "shape.yaml")


def assert_agree(shape: dict) -> None:
    s = scenario(shape)
    fast, exact = simulate(s), simulate(s, exact=True)
    assert exact.summary["symmetry"] is None
    f, e = fast.summary, exact.summary
    if f["symmetry"] is not None:
        assert f["symmetry"]["image_spread_s"] == 0.0
    assert f["step_time_s"] == pytest.approx(e["step_time_s"], rel=1e-9)
    assert f["tflops_per_gpu"] == pytest.approx(e["tflops_per_gpu"], rel=1e-9)
    assert f["mfu"] == pytest.approx(e["mfu"], rel=1e-9)
    assert f["bubble_fraction_per_rank"] == pytest.approx(e["bubble_fraction_per_rank"], rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(fast.log.links.bytes, exact.log.links.bytes, rtol=1e-9, atol=1e-3)
    for rank, streams in e["comm_bytes_sent_per_rank"].items():
        assert f["comm_bytes_sent_per_rank"][rank] == pytest.approx(streams, rel=1e-9)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.filter_too_much])
@given(shapes(max_nodes=8))
def test_symmetric_and_exact_agree_on_fat_trees(shape):
    assert_agree(shape)


@pytest.mark.slow
@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.filter_too_much])
@given(shapes(max_nodes=16))
def test_symmetric_and_exact_agree_on_more_fat_trees(shape):
    assert_agree(shape)


# shapes the issue met: each takes the symmetric path (images per walked rank), and agrees
CASES = {
    # three tiers: pods of 2 nodes under one logical core plane; replicas shift by whole pods
    "three-tiers": (dict(nodes=8, per=4, radix=2, tiers=3, over=2, tp=4, pp=2, dp=4), 4 * 4),
    # a short last leaf group (radix 4, 6 nodes): no node shift but the identity moves it onto
    # itself, yet blocks of 2 nodes lie alike on every leaf: all replicas walk as one, and the
    # network solves one flow per rail orbit
    "uneven-radix": (dict(nodes=6, per=4, radix=4, tiers=2, over=1, tp=4, pp=2, dp=3), 3 * 4),
    "uneven-radix-three-tiers": (dict(nodes=6, per=4, radix=4, tiers=3, over=2, tp=4, pp=2, dp=3), 3 * 4),
    # blocks of 2 nodes straddle oversubscribed leaf groups of 3: every replica walked, one shard of each
    "straddling": (dict(nodes=6, per=4, radix=3, tiers=2, over=1.5, tp=4, pp=2, dp=3), 4),
    # MoE, expert-parallel over pairs of replicas: blocks of 2 x 2 nodes straddle groups of 3, each
    # its own way (groups 0 0 0 1 and 1 1 2 2), so each is walked
    "straddling-moe": (dict(nodes=8, per=4, radix=3, tiers=2, over=1, tp=4, pp=2, dp=4, ep=2), 4),
    # non-blocking: blocks at nodes (0 1) (2 3) (4 5) (6 7) against pods of 3, 3 and 2 nodes lie in
    # classes {0, 2, 3} (inside a pod, the short one too) and {1} (straddling): 3 turns x 4 shards
    "straddling-three-tiers": (dict(nodes=8, per=4, radix=3, tiers=3, over=1, tp=4, pp=2, dp=4), 3 * 4),
    # non-blocking, 12 nodes in groups of 3: blocks 0 2 3 5 inside a group, 1 and 4 straddling:
    # classes of 4 and 2 turn together, lcm 4 turns x 4 shards; 2 blocks walked of 6
    "straddling-classes": (dict(nodes=12, per=4, radix=3, tiers=2, over=1, tp=4, pp=2, dp=6), 4 * 4),
    # Megatron's own order, the pipeline outermost: replica d is node d of stage 0's four and node
    # 4 + d of stage 1's; a shift by two replicas swaps the leaf groups inside each stage's share,
    # and every replica lies alike (a node in one group of each share): one replica walked
    "pipeline-outermost": (dict(nodes=8, per=4, radix=2, tiers=2, over=1, tp=4, pp=2, dp=4, order="pp, dp, tp"), 16),
    # the same with two replicas in a node (tp 2): they do not lie alike (one's data-parallel ring
    # neighbour is over NVLink, the other's through its NIC), so every replica is walked, one shard each
    "pipeline-outermost-shared-nodes": (
        dict(nodes=8, per=4, radix=2, tiers=2, over=1, tp=2, pp=2, dp=8, order="pp, dp, tp"),
        2,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_issue_shapes_take_the_symmetric_path(case):
    shape, images = CASES[case]
    shape = {"balance": "adaptive", "order": ORDERS[0], "batch": 2 * shape["dp"], **shape}
    assert symmetry_of(scenario(shape)).images_per_rank == images
    assert_agree(shape)
