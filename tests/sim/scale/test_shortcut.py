"""Replayed collectives (sim.shortcut) and walking one rank per orbit (sim.symmetry) give the exact
path's results: the same step time, per-rank bubbles, link bytes and bytes per rank, on mid-size
scenarios (64-128 GPUs; dense and MoE; fat trees and a torus) where the shortcuts really apply."""

import numpy as np
import pytest

from clustersim.sim.build import symmetry_of
from clustersim.sim.report import terminal_summary
from clustersim.sim.results.links import hottest_links, utilisation_matrix
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario_text

from symmetric_cases import CASES, SCENARIO, scenario


def run(case: str, exact: bool) -> dict:
    result = simulate(scenario(case), exact=exact)
    stats = result.log.links
    busiest = hottest_links(stats, 16)
    return {
        "summary": result.summary,
        "link_bytes": stats.bytes,
        "over_time": utilisation_matrix(stats, busiest, result.summary["step_time_s"]),
    }


# symmetric cases: a fat tree with adaptive routing; ECMP hashing and the torus tell images apart
SYMMETRIC = {
    "fattree-64-interleaved": 2 * 8,
    "fattree-128-1f1b": 4 * 8,
    "fattree-256-1f1b": 8 * 8,
    "moe-fattree-64": 1 * 8,
}  # images per walked rank: dp / ep x tp
# messages per network flow (sim.orbits): the shifts that move whole leaf groups (16 nodes); with
# 32 nodes in blocks of 4 (pp 4 x tp 8), replicas 0 and 4 only: 2 x 8
FLOW_ORBITS = {"fattree-64-interleaved": 16, "fattree-128-1f1b": 32, "fattree-256-1f1b": 2 * 8, "moe-fattree-64": 8}


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=[pytest.mark.slow] if c in ("fattree-128-1f1b", "fattree-256-1f1b") else []) for c in CASES],
)
def test_replayed_collectives_change_nothing(case):
    fast, exact = run(case, exact=False), run(case, exact=True)
    assert fast["summary"]["replayed_groups"] > 0, "the case must exercise the shortcut"
    assert exact["summary"]["replayed_groups"] == 0 and exact["summary"]["symmetry"] is None
    if case in SYMMETRIC:
        assert fast["summary"]["symmetry"]["images_per_rank"] == SYMMETRIC[case]
        assert fast["summary"]["symmetry"]["image_spread_s"] == 0.0
        assert fast["summary"]["symmetry"]["messages_per_flow"] == FLOW_ORBITS[case]
    else:
        assert fast["summary"]["symmetry"] is None
    assert fast["summary"]["step_time_s"] == pytest.approx(exact["summary"]["step_time_s"], rel=1e-9)
    assert fast["summary"]["bubble_fraction_per_rank"] == pytest.approx(
        exact["summary"]["bubble_fraction_per_rank"], rel=1e-9, abs=1e-12
    )
    np.testing.assert_allclose(fast["link_bytes"], exact["link_bytes"], rtol=1e-12)
    np.testing.assert_allclose(fast["over_time"], exact["over_time"], rtol=1e-9, atol=1e-12)  # links.png's heatmap
    for rank, streams in exact["summary"]["comm_bytes_sent_per_rank"].items():
        assert fast["summary"]["comm_bytes_sent_per_rank"][rank] == pytest.approx(streams, rel=1e-12)


def test_groups_whose_links_carry_other_traffic_are_not_replayed():
    """On one switch every GPU's link carries its tensor-parallel collectives and its pipeline
    messages too: no group qualifies, so everything runs the exact path."""
    text = SCENARIO.format(
        nodes=1,
        per_node=8,
        topology="{kind: switch, link_bandwidth: 450GB/s, link_latency: 1us}",
        tp=4,
        pp=2,
        dp=1,
        global_batch=2,
        schedule="1f1b",
        virtual=1,
    )
    assert simulate(load_scenario_text(text, "switch.yaml")).summary["replayed_groups"] == 0


def test_a_symmetric_runs_table_lists_its_representatives():
    """fattree-128-1f1b: pp 4, dp 4, tp 8; one rank per stage is walked, standing for all 128."""
    result = simulate(scenario("fattree-128-1f1b"))
    text = terminal_summary(result)
    assert "symmetry         4 ranks walked, standing for all 128" in text
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("----"))  # under the table's header
    assert [int(row.split()[0]) for row in lines[rule + 1 :]] == [0, 8, 16, 24]  # rank (d=0, p, t=0) = 8 p


def test_symmetry_needs_shifts_that_map_the_fat_tree_onto_itself():
    """A shift must move whole nodes and leaf groups: tp outermost walks every rank; replicas
    straddling leaf groups (pp 4 x tp 8 = 4 nodes per replica against 6-node leaf groups) lie
    differently on the tree: on an oversubscribed one every replica is walked, only the rails
    (shards) shifted; on a non-blocking one, one replica per class of those lying alike: nodes
    0-3, 8-11 and 12-15 (the short last group) inside a group, 4-7 across two."""
    base = scenario("fattree-128-1f1b")
    assert symmetry_of(base) is not None
    tp_outer = base.parallel.model_copy(update={"order": ["tp", "pp", "dp"]})
    assert symmetry_of(base.model_copy(update={"parallel": tp_outer})) is None
    cluster = base.cluster

    def straddling(**keys):
        topology = cluster.topology.model_copy(update={"leaf_radix": 6, **keys})
        return symmetry_of(base.model_copy(update={"cluster": cluster.model_copy(update={"topology": topology})}))

    shards_only = straddling(oversubscription=2)
    assert shards_only is not None and shards_only.shifts == [(0, b) for b in range(8)]
    assert shards_only.representatives == list(range(0, 4 * 4 * 8, 8))  # every (d, p), t = 0
    classes = straddling()
    assert classes is not None and classes.shifts == [(j, b) for j in range(3) for b in range(8)]
    assert classes.representatives == [32 * d + 8 * p for d in (0, 1) for p in range(4)]
    # replica 2 (ranks 64-95) is replica 0's image
    assert sorted(classes.rep_of[64:96].tolist()) == sorted([8 * p for p in range(4)] * 8)
