"""topologies/: every builder follows the graph schema and its closed-form sizes; routers give
connected fewest-hop paths (dimension order on tori and meshes, ECMP on fat trees) and agree with
networkx's shortest path lengths; specs parse or name the mistake; scenarios select every kind;
`clustersim topology` draws a PNG."""

import math
import re

import networkx as nx
import numpy as np
import pytest

from clustersim.sim.build import build_topology
from clustersim.sim.cli import main
from clustersim.sim.scenario.loader import load_scenario_text
from clustersim.sim.scenario.schema import ScenarioError
from clustersim.sim.scenario.spec import SpecError, parse_spec
from clustersim.sim.views.topology import draw_topology
from clustersim.topologies.dgx import CX7_BANDWIDTH_Bps, NVLINK4_BANDWIDTH_Bps, dgx_node
from clustersim.topologies.fattree import EcmpRouter, fat_tree
from clustersim.topologies.kind import SHARDS_ONLY, ReplicaBlocks, Shape
from clustersim.topologies.registry import ROUTERS, TOPOLOGIES, topology_kind
from clustersim.topologies.ring import ring
from clustersim.topologies.routing import ShortestPathRouter, flow_hash, make_router
from clustersim.topologies.schema import BANDWIDTH, KIND, check_schema, gpu_nodes
from clustersim.topologies.switch import switch
from clustersim.topologies.torus import DimensionOrderRouter, check_axes, mesh, torus

from repo import ROOT

BW, LAT = 100e9, 1e-6

BUILDS = {
    "switch-1": lambda: switch(1, BW, LAT),
    "switch-8": lambda: switch(8, BW, LAT),
    "ring-1": lambda: ring(1, BW, LAT),
    "ring-2": lambda: ring(2, BW, LAT),
    "ring-7": lambda: ring(7, BW, LAT),
    "torus-5": lambda: torus((5,), BW, LAT),
    "torus-2x2": lambda: torus((2, 2), BW, LAT),
    "torus-4x6": lambda: torus((4, 6), BW, LAT),
    "torus-3x4x5": lambda: torus((3, 4, 5), BW, LAT),
    "torus-2x1x4": lambda: torus((2, 1, 4), BW, LAT),
    "mesh-4": lambda: mesh((4,), BW, LAT),
    "mesh-3x4": lambda: mesh((3, 4), BW, LAT),
    "mesh-2x3x4": lambda: mesh((2, 3, 4), BW, LAT),
    "dgx": lambda: dgx_node(),
    "dgx-4": lambda: dgx_node(gpus_per_node=4),
    "fattree-1x8": lambda: fat_tree(1, 8),
    "fattree-8x8": lambda: fat_tree(8, 8),
    "fattree-5x4-radix2": lambda: fat_tree(5, 4, leaf_radix=2),
    "fattree-8x8-os2": lambda: fat_tree(8, 8, oversubscription=2),
    "fattree-6x4-3tier": lambda: fat_tree(6, 4, leaf_radix=2, tiers=3),
    "fattree-5x2-3tier-os3": lambda: fat_tree(5, 2, leaf_radix=4, tiers=3, oversubscription=3),
}


def all_pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every ordered pair (s, d), s != d."""
    s, d = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    keep = s != d
    return s[keep], d[keep]


def node_paths(graph, src, dst) -> list[list]:
    """Each routed flow as its list of nodes, checking that consecutive links chain."""
    edges = list(graph.edges)
    indptr, links = make_router(graph).route_many(src, dst)
    assert indptr.dtype == np.int64 and links.dtype == np.int64 and indptr.shape == (len(src) + 1,)
    paths = []
    for i in range(len(src)):
        hops = [edges[link] for link in links[indptr[i] : indptr[i + 1]]]
        for (_, v), (u, _) in zip(hops, hops[1:]):
            assert v == u, f"flow {src[i]}->{dst[i]}: links do not chain: {hops}"
        paths.append([hops[0][0]] + [v for _, v in hops] if hops else [])
    return paths


def assert_routes_connect(graph):
    gpus = gpu_nodes(graph)
    src, dst = all_pairs(len(gpus))
    for s, d, path in zip(src, dst, node_paths(graph, src, dst)):
        assert path[0] == gpus[s] and path[-1] == gpus[d], (s, d, path)
        assert len(path) - 1 == nx.shortest_path_length(graph, gpus[s], gpus[d]), (s, d, path)


# --- schema and sizes ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILDS)
def test_every_builder_passes_the_schema(name):
    graph = BUILDS[name]()
    check_schema(graph)
    assert all(graph.nodes[n][KIND] == "gpu" for n in gpu_nodes(graph))


@pytest.mark.parametrize("name", BUILDS)
def test_every_router_gives_connected_fewest_hop_paths(name):
    """Vectorised routers agree with networkx shortest path lengths on small instances."""
    assert_routes_connect(BUILDS[name]())


def torus_edges(axes, wrap) -> int:
    """Directed edges: per axis of size k, 2N (torus, k > 2), N (torus, k = 2: one duplex link per
    pair, the + and - neighbours coincide), 2N(k-1)/k (mesh), 0 (k = 1)."""
    n = math.prod(axes)
    total = 0
    for k in axes:
        if wrap and k > 2:
            total += 2 * n
        else:
            total += 2 * n * (k - 1) // k
    return total


@pytest.mark.parametrize("axes", [(8,), (3, 3), (4, 6), (3, 4, 5), (8, 8, 16), (2, 2), (2, 4, 4), (1, 4), (2,)])
@pytest.mark.parametrize("wrap", [True, False])
def test_torus_and_mesh_counts(axes, wrap):
    graph = torus(axes, BW, LAT, wrap=wrap)
    n = math.prod(axes)
    assert graph.number_of_nodes() == n and len(gpu_nodes(graph)) == n
    assert graph.number_of_edges() == torus_edges(axes, wrap)
    if wrap and min(axes) > 2:
        assert graph.number_of_edges() == 2 * len(axes) * n  # every GPU: a + and a - link per axis
    assert graph.graph["axes"] == tuple(axes) and graph.graph["wrap"] is wrap
    assert graph.graph["topology"] == ("torus" if wrap else "mesh")


def test_ring_is_a_one_axis_torus():
    graph = ring(6, BW, LAT)
    assert graph.graph["topology"] == "ring" and graph.number_of_edges() == 12
    assert sorted(graph.successors(("gpu", 0))) == [("gpu", 1), ("gpu", 5)]
    assert ring(2, BW, LAT).number_of_edges() == 2  # one duplex link
    assert ring(1, BW, LAT).number_of_edges() == 0


def fat_tree_sizes(nodes, gpus, radix, over, tiers):
    """(graph nodes, directed edges) in closed form; see topologies/fattree.py."""
    groups, down = math.ceil(nodes / radix), min(radix, nodes)
    spines = math.ceil(down / over)
    switches = groups * gpus + (spines if tiers == 2 else groups * spines) + (spines * gpus if tiers == 3 else 0)
    duplex = 3 * nodes * gpus + groups * gpus * spines + (groups * spines * gpus if tiers == 3 else 0)
    return 2 * nodes * gpus + nodes + switches, 2 * duplex


@pytest.mark.parametrize(
    "nodes,gpus,radix,over,tiers",
    [
        (1, 8, 32, 1, 2),
        (8, 8, 32, 1, 2),
        (8, 8, 32, 2, 2),
        (128, 8, 32, 1, 2),
        (5, 4, 2, 1, 2),
        (6, 4, 2, 1, 3),
        (128, 8, 32, 2, 3),
        (5, 2, 4, 3, 3),
        (9, 8, 4, 1.5, 3),
    ],
)
def test_fat_tree_counts(nodes, gpus, radix, over, tiers):
    graph = fat_tree(nodes, gpus, leaf_radix=radix, oversubscription=over, tiers=tiers)
    assert (graph.number_of_nodes(), graph.number_of_edges()) == fat_tree_sizes(nodes, gpus, radix, over, tiers)
    assert len(gpu_nodes(graph)) == nodes * gpus
    kinds = [d[KIND] for _, d in graph.nodes(data=True)]
    assert kinds.count("nvswitch") == nodes and kinds.count("nic") == nodes * gpus
    assert kinds.count("core") == (0 if tiers == 2 else math.ceil(min(radix, nodes) / over) * gpus)


def leaf_bandwidth(graph, up: bool) -> float:
    """Total bandwidth out of every leaf, up to spines or down to NICs."""
    to = "spine" if up else "nic"
    return sum(
        d[BANDWIDTH]
        for u, v, d in graph.edges(data=True)
        if graph.nodes[u][KIND] == "leaf" and graph.nodes[v][KIND] == to
    )


@pytest.mark.parametrize("over", [1, 2, 3, 1.5, 4])
@pytest.mark.parametrize("tiers", [2, 3])
def test_leaf_uplinks_are_downlinks_over_oversubscription(over, tiers):
    graph = fat_tree(8, 8, leaf_radix=8, oversubscription=over, tiers=tiers)
    assert leaf_bandwidth(graph, up=True) == pytest.approx(leaf_bandwidth(graph, up=False) / over)


def test_oversubscription_2_halves_the_leaf_uplinks():
    full, half = fat_tree(16, 8, leaf_radix=16), fat_tree(16, 8, leaf_radix=16, oversubscription=2)
    assert leaf_bandwidth(half, up=True) == pytest.approx(leaf_bandwidth(full, up=True) / 2)
    assert leaf_bandwidth(full, up=True) == pytest.approx(leaf_bandwidth(full, up=False))  # full bisection
    assert leaf_bandwidth(half, up=False) == leaf_bandwidth(full, up=False)


def test_adaptive_three_tiers_spray_over_one_logical_core_per_plane():
    """Adaptive load balance merges a plane's cores as it merges the spines: one core, whose link
    from each pod's spine carries the G links' total, so core hashing cannot tell flows apart."""
    ecmp, adaptive = (fat_tree(8, 4, leaf_radix=2, tiers=3, load_balance=lb) for lb in ("ecmp", "adaptive"))
    kinds = [d[KIND] for _, d in adaptive.nodes(data=True)]
    assert kinds.count("core") == 1 and kinds.count("spine") == 4  # one per pod

    def core_bandwidth(graph) -> float:
        return sum(d[BANDWIDTH] for u, v, d in graph.edges(data=True) if graph.nodes[v][KIND] == "core")

    assert core_bandwidth(adaptive) == pytest.approx(core_bandwidth(ecmp))
    router = EcmpRouter(adaptive)
    indptr, links = router.route_many(np.array([0, 1]), np.array([30, 31]))
    assert np.diff(indptr).tolist() == [8, 8]  # via the core, on the same spine-core links
    names = list(adaptive.edges)
    assert [names[i][1] for i in links[2:4]] == [names[i][1] for i in links[10:12]]


BLOCKS_8_NODES = dict(gpus=64, tp=8, contiguous=True)


@pytest.mark.parametrize(
    "nodes,radix,tiers,balance,blocks,step",
    [
        (192, 16, 2, "adaptive", BLOCKS_8_NODES, 2),  # two blocks per 16-node group
        (192, 16, 3, "adaptive", BLOCKS_8_NODES, 2),  # the same with pods
        (192, 20, 2, "adaptive", BLOCKS_8_NODES, SHARDS_ONLY),  # blocks straddle 20-node groups
        (192, 40, 2, "adaptive", BLOCKS_8_NODES, 24),  # nested, but the last group is short: identity
        (192, 4, 2, "adaptive", BLOCKS_8_NODES, 1),  # two groups per block
        (16, 20, 3, "adaptive", BLOCKS_8_NODES, 1),  # one group: any shift of whole nodes
        (8, 3, 2, "adaptive", dict(gpus=4, tp=4, contiguous=True), SHARDS_ONLY),  # half-node blocks
        (192, 16, 2, "ecmp", BLOCKS_8_NODES, None),  # hashing tells images apart
        (192, 16, 2, "adaptive", dict(gpus=64, tp=8, contiguous=False), None),
        (192, 16, 2, "adaptive", dict(gpus=48, tp=3, contiguous=True), None),  # shards split rails unevenly
    ],
)
def test_fat_tree_symmetry_steps(nodes, radix, tiers, balance, blocks, step):
    kind = TOPOLOGIES["fattree"]
    keys = kind.keys.model_validate(
        {"leaf_radix": radix, "tiers": tiers, "load_balance": balance, "link_latency": 1e-6}
    )
    gpus_per_node = 8
    count = nodes * gpus_per_node // blocks["gpus"]
    answer = kind.symmetry(keys, Shape(nodes, gpus_per_node), ReplicaBlocks(count=count, **blocks))
    assert answer == step


def megatron_blocks(nodes: int, tp: int, pp: int) -> ReplicaBlocks:
    """Replicas laid out in Megatron's order (pipeline outermost, tensor parallel innermost) on
    nodes of 8 GPUs: replica d holds GPUs p x (dp tp) + d tp .. + tp - 1 of each stage p."""
    dp = nodes * 8 // (tp * pp)
    grid = np.arange(nodes * 8).reshape(pp, dp, tp).transpose(1, 0, 2)  # (dp, pp, tp) -> GPU
    return ReplicaBlocks(pp * tp, dp, tp, False, tuple(map(tuple, grid.reshape(dp, -1).tolist())))


@pytest.mark.parametrize(
    "nodes,radix,tp,pp,step",
    [
        (64, 16, 8, 2, 16),  # each stage's 32 nodes are two groups: shifting 16 replicas swaps them
        (64, 32, 8, 2, 1),  # each stage's share is one group: any shift of whole nodes
        (64, 32, 2, 2, SHARDS_ONLY),  # four replicas a node: they do not lie alike, each walked
        (48, 16, 8, 2, SHARDS_ONLY),  # shares of 24 nodes straddle groups of 16 unalike
    ],
)
def test_fat_tree_symmetry_of_megatron_s_rank_order(nodes, radix, tp, pp, step):
    kind = TOPOLOGIES["fattree"]
    keys = kind.keys.model_validate({"leaf_radix": radix, "load_balance": "adaptive", "link_latency": 1e-6})
    assert kind.symmetry(keys, Shape(nodes, 8), megatron_blocks(nodes, tp, pp)) == step


def test_dgx_presets_are_h100_nvlink4_and_connectx7():
    graph = dgx_node()
    bandwidths = {(graph.nodes[u][KIND], graph.nodes[v][KIND]): d[BANDWIDTH] for u, v, d in graph.edges(data=True)}
    assert bandwidths[("gpu", "nvswitch")] == NVLINK4_BANDWIDTH_Bps == 450e9  # 900 GB/s both ways
    assert bandwidths[("gpu", "nic")] == CX7_BANDWIDTH_Bps == 50e9  # 400 Gb/s
    assert len(gpu_nodes(graph)) == 8
    assert (graph.graph["nodes"], graph.graph["gpus_per_node"]) == (1, 8)


@pytest.mark.parametrize(
    "build,match",
    [
        (lambda: torus((4, 4, 4, 4), BW, LAT), "1 to 3 axes"),
        (lambda: torus((0, 4), BW, LAT), "integers >= 1"),
        (lambda: torus((4,), 0.0, LAT), "bandwidth_Bps > 0"),
        (lambda: fat_tree(8, 8, tiers=4), "tiers must be 2 or 3"),
        (lambda: fat_tree(8, 8, oversubscription=0), "oversubscription must be > 0"),
        (lambda: fat_tree(8.0, 8), "nodes must be an integer"),
        (lambda: fat_tree(8, 8, latency_s=-1.0), "latency_s must be >= 0"),
    ],
)
def test_builders_reject_bad_sizes(build, match):
    with pytest.raises(ValueError, match=match):
        build()


# --- dimension-order routing --------------------------------------------------------------------


def torus_distance(src: np.ndarray, dst: np.ndarray, axes, wrap: bool = True) -> np.ndarray:
    """Hops between GPU indices: sum over axes of min(d, k - d) on a torus, |d| on a mesh."""
    axes = check_axes(axes)
    cs, cd = np.unravel_index(np.asarray(src), axes), np.unravel_index(np.asarray(dst), axes)
    total = np.zeros(np.shape(src), dtype=np.int64)
    for a, k in enumerate(axes):
        d = np.abs(cd[a] - cs[a])
        total += np.minimum(d, k - d) if wrap else d
    return total


@pytest.mark.parametrize("axes", [(6,), (4, 4), (3, 4, 5), (4, 2, 6), (2, 2, 2)])
@pytest.mark.parametrize("wrap", [True, False])
def test_dor_path_length_is_the_torus_distance(axes, wrap):
    graph = torus(axes, BW, LAT, wrap=wrap)
    src, dst = all_pairs(math.prod(axes))
    indptr, _ = make_router(graph).route_many(src, dst)
    assert np.array_equal(np.diff(indptr), torus_distance(src, dst, axes, wrap))


def coords(node, axes):
    return tuple(int(c) for c in np.unravel_index(node[1], axes))


@pytest.mark.parametrize("axes,wrap", [((4, 3, 5), True), ((3, 4, 2), False), ((6, 6), True)])
def test_dor_corrects_axis_0_then_1_then_2(axes, wrap):
    graph = torus(axes, BW, LAT, wrap=wrap)
    src, dst = all_pairs(math.prod(axes))
    for path in node_paths(graph, src, dst):
        moved = [
            next(a for a, (x, y) in enumerate(zip(coords(u, axes), coords(v, axes))) if x != y)
            for u, v in zip(path, path[1:])
        ]
        assert moved == sorted(moved), path


def test_dor_ties_go_plus_and_shorter_way_round():
    graph = torus((6, 4), BW, LAT)
    [path] = node_paths(graph, np.array([0]), np.array([3 * 4 + 2]))  # (0,0) -> (3,2): both ties
    assert [coords(n, (6, 4)) for n in path] == [(0, 0), (1, 0), (2, 0), (3, 0), (3, 1), (3, 2)]
    [path] = node_paths(graph, np.array([3 * 4 + 2]), np.array([0]))  # back: ties again go +
    assert [coords(n, (6, 4)) for n in path] == [(3, 2), (4, 2), (5, 2), (0, 2), (0, 3), (0, 0)]
    [path] = node_paths(graph, np.array([0]), np.array([5 * 4 + 3]))  # (5,3): one step - on each axis
    assert [coords(n, (6, 4)) for n in path] == [(0, 0), (5, 0), (5, 3)]
    [path] = node_paths(ring(6, BW, LAT), np.array([4]), np.array([1]))
    assert [n[1] for n in path] == [4, 5, 0, 1]


def test_mesh_takes_the_only_direction():
    graph = mesh((6, 4), BW, LAT)
    [path] = node_paths(graph, np.array([5 * 4 + 3]), np.array([0]))  # no wraparound: all the way back
    assert [coords(n, (6, 4)) for n in path] == [(5, 3), (4, 3), (3, 3), (2, 3), (1, 3), (0, 3), (0, 2), (0, 1), (0, 0)]


def test_same_src_and_dst_is_an_empty_path():
    for graph in (torus((4, 4), BW, LAT), fat_tree(2, 4), switch(4, BW, LAT)):
        indptr, links = make_router(graph).route_many(np.array([1, 2]), np.array([1, 3]))
        assert indptr[1] == 0 and indptr[2] > 0


def test_routers_are_deterministic_and_reject_bad_indices():
    for graph in (torus((4, 4), BW, LAT), fat_tree(4, 4, leaf_radix=2, tiers=3), switch(4, BW, LAT)):
        src, dst = all_pairs(len(gpu_nodes(graph)))
        first, again = make_router(graph).route_many(src, dst), make_router(graph).route_many(src, dst)
        assert all(np.array_equal(a, b) for a, b in zip(first, again))
        with pytest.raises(ValueError, match="GPU indices must be in"):
            make_router(graph).route_many(np.array([0]), np.array([len(gpu_nodes(graph))]))


def test_make_router_dispatches_on_the_graph_and_lists_names_on_a_miss():
    assert isinstance(make_router(torus((4,), BW, LAT)), DimensionOrderRouter)
    assert isinstance(make_router(fat_tree(2, 2)), EcmpRouter)
    assert isinstance(make_router(switch(2, BW, LAT)), ShortestPathRouter)
    assert isinstance(make_router(dgx_node()), ShortestPathRouter)
    graph = switch(2, BW, LAT)
    graph.graph["routing"] = "teleport"
    with pytest.raises(ValueError, match=rf"unknown routing 'teleport' \(valid: {', '.join(ROUTERS)}\)"):
        make_router(graph)


def test_the_registry_is_a_dict_of_kinds_and_a_miss_lists_the_names():
    assert all(name == kind.name for name, kind in TOPOLOGIES.items())
    assert topology_kind("torus") is TOPOLOGIES["torus"]
    with pytest.raises(KeyError, match=r"unknown topology kind 'hypercube' \(valid: switch, ring, torus, mesh"):
        topology_kind("hypercube")


# --- ECMP on the fat tree -------------------------------------------------------------------------


def kinds_on(graph, path):
    return [graph.nodes[n][KIND] for n in path]


@pytest.mark.parametrize("tiers", [2, 3])
def test_ecmp_path_shapes(tiers):
    graph = fat_tree(4, 4, leaf_radix=2, tiers=tiers)  # 2 groups (pods) of 2 nodes
    src, dst = all_pairs(16)
    for s, d, path in zip(src, dst, node_paths(graph, src, dst)):
        ns, nd, rs, rd = s // 4, d // 4, s % 4, d % 4
        if ns == nd:  # same node: NVSwitch only
            assert kinds_on(graph, path) == ["gpu", "nvswitch", "gpu"]
            assert path[1] == ("nvswitch", ns)
        elif rs == rd and ns // 2 == nd // 2:  # same rail, same leaf
            assert kinds_on(graph, path) == ["gpu", "nic", "leaf", "nic", "gpu"]
        elif tiers == 3 and ns // 2 != nd // 2:  # another pod: through a core
            assert kinds_on(graph, path) == ["gpu", "nic", "leaf", "spine", "core", "spine", "leaf", "nic", "gpu"]
            assert path[3][2] == path[5][2] and path[3][1] == ns // 2 and path[5][1] == nd // 2
        else:
            assert kinds_on(graph, path) == ["gpu", "nic", "leaf", "spine", "leaf", "nic", "gpu"]
        if len(path) > 3:  # the NICs and leaves are the GPUs' own, on their rails
            assert path[1] == ("nic", s) and path[-2] == ("nic", d)
            assert path[2] == ("leaf", rs, ns // 2) and path[-3] == ("leaf", rd, nd // 2)


def usage(graph, src, dst, kind) -> np.ndarray:
    """Flows through each node of `kind`, in node order."""
    nodes = [n for n, d in graph.nodes(data=True) if d[KIND] == kind]
    count = dict.fromkeys(nodes, 0)
    for path in node_paths(graph, src, dst):
        for n in path:
            if n in count:
                count[n] += 1
    return np.array(list(count.values()))


def test_ecmp_spreads_all_pairs_evenly_over_spines():
    """All-pairs on 16 nodes x 8 GPUs, one leaf per rail, 16 spines: every spine carries within 10%
    of the mean (13,440 cross-rail flows, 840 per spine on average)."""
    graph = fat_tree(16, 8, leaf_radix=16)
    src, dst = all_pairs(128)
    per_spine = usage(graph, src, dst, "spine")
    assert len(per_spine) == 16 and per_spine.sum() == 128 * 127 - 16 * 8 * 7 - 8 * 16 * 15
    assert np.abs(per_spine / per_spine.mean() - 1).max() < 0.10, per_spine


def test_ecmp_spreads_cross_pod_flows_over_cores():
    """Three tiers, 4 pods of 4 nodes x 8 GPUs, 4 spines per pod and 32 cores: each core within 20% of
    the mean (12,288 cross-pod flows, 384 per core on average); each pod's spines within 10%."""
    graph = fat_tree(16, 8, leaf_radix=4, tiers=3)
    src, dst = all_pairs(128)
    per_core = usage(graph, src, dst, "core")
    assert len(per_core) == 32 and per_core.sum() == 128 * 96
    assert np.abs(per_core / per_core.mean() - 1).max() < 0.20, per_core
    per_spine = usage(graph, src, dst, "spine")
    assert np.abs(per_spine / per_spine.mean() - 1).max() < 0.10, per_spine


def test_flow_hash_is_splitmix64_of_the_pair():
    """The hash decides which spine a flow takes, so results depend on it: pin it. Key 0 * 8 + 1 = 1
    gives splitmix64's well-known first output for seed 1."""
    h = flow_hash(np.array([0, 1, 5]), np.array([1, 0, 7]), 8)
    assert h.dtype == np.uint64
    assert h.tolist() == [0x910A2DEC89025CC1, 0x9E5651B0EF953636, 0x7BB3C45C597CDB85]


# --- specs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,gpus,topology",
    [
        ("ring:8", 8, "ring"),
        ("switch:16", 16, "switch"),
        ("torus:4x4x4", 64, "torus"),
        ("torus:8x8", 64, "torus"),
        ("torus:5", 5, "torus"),
        ("mesh:4x4", 16, "mesh"),
        ("dgx:1", 8, "dgx"),
        ("dgx:1,gpus_per_node=4", 4, "dgx"),
        ("fattree:nodes=8,gpus_per_node=8", 64, "fattree"),
        ("fattree:nodes=8,gpus_per_node=8,oversubscription=2,tiers=3", 64, "fattree"),
        (" torus:2x2, link_bandwidth=50GB/s, link_latency=0 ", 4, "torus"),
        ("torus:2x2,link_bandwidth_Bps=5e10,link_latency_s=1e-6", 4, "torus"),
        ("ring:4,link_bandwidth=25GB/s,link_latency=1us", 4, "ring"),
        ("fattree:nodes=2,nvlink_bandwidth_Bps=3e11", 16, "fattree"),
    ],
)
def test_spec_builds_the_named_topology(spec, gpus, topology):
    graph = parse_spec(spec)
    check_schema(graph)
    assert len(gpu_nodes(graph)) == gpus and graph.graph.get("topology") == topology


def test_spec_link_options():
    """Keys given to parse_spec (the CLI's flags) override the spec's; units parse as in YAML; a bare
    number is SI only under the attribute name that says its unit."""
    assert {d[BANDWIDTH] for *_, d in parse_spec("ring:4", link_bandwidth_Bps=7e9).edges(data=True)} == {7e9}
    assert {d[BANDWIDTH] for *_, d in parse_spec("ring:4,link_bandwidth=3GB/s").edges(data=True)} == {3e9}
    assert {
        d[BANDWIDTH] for *_, d in parse_spec("ring:4,link_bandwidth=3GB/s", link_bandwidth="7GB/s").edges(data=True)
    } == {7e9}
    with pytest.raises(
        SpecError, match=r"link_bandwidth: 3000000000\.0 has no unit: add one .*e\.g\. '3000000000\.0GB/s'"
    ):
        parse_spec("ring:4", link_bandwidth=3e9)
    tree = parse_spec("fattree:nodes=4,gpus_per_node=2,oversubscription=2,tiers=3")
    assert (tree.graph["tiers"], tree.graph["oversubscription"]) == (3, 2)


@pytest.mark.parametrize(
    "spec,match",
    [
        ("hypercube:4", r"unknown kind 'hypercube' \(valid: switch, ring, torus, mesh, dgx, fattree"),
        ("ring", "ring needs a GPU count"),
        ("ring:x", r"ring needs a GPU count, e.g. ring:8 \(an integer >= 1\), got 'x'"),
        ("ring:0", "an integer >= 1"),
        ("torus:4x4x4x4", r"\(1 to 3 axes\), got '4x4x4x4'"),
        ("torus:4by4", "torus needs axis sizes"),
        ("torus:0x4", r"axes\.0: must be > 0, got 0"),
        ("fattree:8", "expected key=value, got '8'"),
        ("fattree:nodes=0", "nodes: expected an integer >= 1, got 0"),
        ("fattree:nodes=8,colour=2", r"colour: unknown key 'colour' \(allowed: kind, nvlink_bandwidth,"),
        ("fattree:nodes=8,link_bandwidth=1GB/s", "link_bandwidth: not used by topology kind 'fattree'"),
        ("fattree:nodes=8,tiers=4", "tiers: must be <= 3, got 4"),
        ("ring:8,link_bandwidth=fast", r"link_bandwidth: 'fast' is not a bandwidth"),
        ("switch:4,link_bandwidth=0GB/s", "link_bandwidth: must be > 0"),
        ("switch:4,link_bandwidth=300", "link_bandwidth: 300 has no unit"),
        ("dgx:2", "dgx needs a node count"),
    ],
)
def test_spec_errors_name_the_spec_and_the_problem(spec, match):
    with pytest.raises(ValueError, match=rf"^topology spec {re.escape(repr(spec))}: .*{match}"):
        parse_spec(spec)


# --- scenarios ------------------------------------------------------------------------------------

SCENARIO = """
name: topo
cluster:
  gpu: H100-SXM
  nodes: {nodes}
  gpus_per_node: {gpus_per_node}
  topology: {topology}
model: {{layers: 4, hidden: 256, heads: 4, seq_len: 64, vocab: 100}}
training: {{global_batch: 4, micro_batch: 1}}
parallel: {{pp: 4}}
numerics: {{enabled: false}}
output: {{dir: {out}}}
"""

KINDS = {  # kind -> (nodes, gpus_per_node, topology)
    "switch": (1, 4, "{kind: switch, link_bandwidth: 300GB/s, link_latency: 1us}"),
    "ring": (1, 4, "{kind: ring, link_bandwidth: 300GB/s, link_latency: 1us}"),
    "torus": (1, 4, "{kind: torus, axes: [2, 2], wrap: true, link_bandwidth: 100GB/s, link_latency: 1us}"),
    "mesh": (1, 4, "{kind: mesh, axes: [4], link_bandwidth: 100GB/s, link_latency: 1us}"),
    "dgx": (1, 4, "{kind: dgx, link_latency: 1us}"),
    "fattree": (
        2,
        2,
        "{kind: fattree, nvlink_bandwidth: 450GB/s, nic_bandwidth: 50GB/s, leaf_radix: 32, "
        "oversubscription: 1, tiers: 2, link_latency: 1us}",
    ),
    "dragonfly": (
        2,
        2,
        "{kind: dragonfly, routers_per_group: 1, global_links_per_router: 1, link_bandwidth: 25GB/s, "
        "global_bandwidth: 25GB/s, link_latency: 1us}",
    ),
}


def scenario_text(kind_or_topology: str, nodes=None, gpus_per_node=None, out="runs/topo") -> str:
    n, g, topology = KINDS.get(kind_or_topology, (1, 4, kind_or_topology))
    return SCENARIO.format(nodes=nodes or n, gpus_per_node=gpus_per_node or g, topology=topology, out=out)


def test_run_and_cli_never_name_a_kind():
    """The kinds are the registry's business: sim/build.py, sim/run.py, the CLI and the cluster
    section's checks hold no kind's name."""
    import ast

    root = ROOT / "sim"
    for module in ("build.py", "run.py", "cli.py", "cli_fabric.py", "cli_plan.py", "scenario/sections.py"):
        tree = ast.parse((root / module).read_text())
        named = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)} & set(TOPOLOGIES)
        assert not named, f"sim/{module} names topology kinds {sorted(named)}"


def test_every_registered_kind_has_a_scenario_case():
    assert set(KINDS) == set(TOPOLOGIES)


@pytest.mark.parametrize("kind", KINDS)
def test_scenario_selects_every_kind(kind):
    scenario = load_scenario_text(scenario_text(kind), "s.yaml")
    graph = build_topology(scenario)
    check_schema(graph)
    assert scenario.cluster.topology.kind == kind
    assert len(gpu_nodes(graph)) == scenario.num_gpus == 4


def test_scenario_fat_tree_and_dgx_defaults_are_dgx_h100():
    topology = load_scenario_text(scenario_text("{kind: fattree, link_latency: 1us}", 2, 2)).cluster.topology
    assert (topology.nvlink_bandwidth_Bps, topology.nic_bandwidth_Bps) == (450e9, 50e9)
    assert (topology.leaf_radix, topology.oversubscription, topology.tiers) == (32, 1.0, 2)
    torus_section = load_scenario_text(
        scenario_text("{kind: torus, axes: [4], link_bandwidth: 1GB/s, link_latency: 1us}")
    ).cluster.topology
    assert torus_section.wrap is True


@pytest.mark.parametrize(
    "topology,nodes,path,reason",
    [
        (
            "{kind: torus, axes: [4, 4], link_bandwidth: 1GB/s, link_latency: 1us}",
            1,
            "cluster.topology.axes",
            r"4 x 4 = 16 GPUs != 4 \(cluster.nodes 1 x cluster.gpus_per_node 4\)$",
        ),
        (
            "{kind: torus, link_bandwidth: 1GB/s, link_latency: 1us}",
            1,
            "cluster.topology.axes",
            "required for topology kind 'torus'$",
        ),
        (
            "{kind: torus, axes: [1, 1, 2, 2], link_bandwidth: 1GB/s, link_latency: 1us}",
            1,
            "cluster.topology.axes",
            r"expected a list of 1 to 3 axis sizes, e.g. \[4, 4, 4\], got 4 axes$",
        ),
        (
            "{kind: switch, axes: [4], link_bandwidth: 1GB/s, link_latency: 1us}",
            1,
            "cluster.topology.axes",
            r"not used by topology kind 'switch' \(it takes: link_bandwidth, link_latency\)$",
        ),
        (
            "{kind: fattree, link_bandwidth: 1GB/s, link_latency: 1us}",
            1,
            "cluster.topology.link_bandwidth",
            "not used by topology kind 'fattree'",
        ),
        (
            "{kind: switch, link_latency: 1us}",
            1,
            "cluster.topology.link_bandwidth",
            "required for topology kind 'switch'$",
        ),
        (
            "{kind: mesh, axes: [4], wrap: true, link_bandwidth: 1GB/s, link_latency: 1us}",
            1,
            "cluster.topology.wrap",
            "not used by topology kind 'mesh'",
        ),
        ("{kind: fattree, tiers: 4, link_latency: 1us}", 1, "cluster.topology.tiers", "must be <= 3, got 4$"),
        (
            "{kind: fattree, oversubscription: 0, link_latency: 1us}",
            1,
            "cluster.topology.oversubscription",
            "must be > 0",
        ),
        (
            "{kind: ring, link_bandwith: 1GB/s, link_latency: 1us}",
            1,
            "cluster.topology.link_bandwith",
            r"unknown key 'link_bandwith' \(allowed: kind, link_bandwidth, link_latency\); "
            r"did you mean 'link_bandwidth'\?$",
        ),
        ("{kind: hypercube}", 1, "cluster.topology.kind", r"unknown topology kind 'hypercube' \(valid: switch, ring,"),
        ("{kind: dgx, link_latency: 1us}", 2, "cluster.nodes", "2: topology kind 'dgx' is one node"),
    ],
)
def test_scenario_rejects_a_topology_that_does_not_fit(topology, nodes, path, reason):
    text = scenario_text(topology, nodes=nodes, gpus_per_node=4 // nodes)
    with pytest.raises(ScenarioError, match=f"^s.yaml: {path}: {reason}"):
        load_scenario_text(text, "s.yaml")


# --- drawing --------------------------------------------------------------------------------------


def test_clustersim_topology_writes_a_png_and_prints_counts(tmp_path, capsys, monkeypatch):
    """The default PNG goes to runs/topology/<name>.png, in no run's folder (a run into the
    scenario's folder must not find a file it did not write there)."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "s.yaml"
    path.write_text(scenario_text("fattree", out=tmp_path / "run"))
    assert main(["topology", str(path)]) == 0
    png = tmp_path / "runs" / "topology" / "topo.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    # 2 nodes x 2 GPUs: a leaf per rail, 2 spines; links 3 per GPU + 2 leaves x 2 spines
    assert "topo: 14 nodes (4 gpu, 2 nvswitch, 4 nic, 2 leaf, 2 spine), 16 links (32 directed edges)" in out
    assert main(["topology", "torus:4x4", "-o", str(tmp_path / "t.png")]) == 0
    assert (tmp_path / "t.png").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["runs", "s.yaml", "t.png"]


def test_clustersim_topology_bad_spec_is_one_line_exit_2(tmp_path, capsys):
    assert main(["topology", "torus:4x4x", "-o", str(tmp_path / "t.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clustersim: error: (command line): SCENARIO: topology spec 'torus:4x4x'")
    assert err.count("\n") == 1
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", ["ring-7", "torus-4x6", "torus-3x4x5", "mesh-3x4", "fattree-6x4-3tier", "switch-8"])
def test_drawing_is_byte_identical_with_and_without_load(tmp_path, name):
    graph = BUILDS[name]()
    load = {i: (i % 7) / 6 for i in range(graph.number_of_edges())}
    for tag, link_load in (("plain", None), ("load", load)):
        a, b = tmp_path / f"{tag}-a.png", tmp_path / f"{tag}-b.png"
        draw_topology(graph, a, name, link_load)
        draw_topology(graph, b, name, link_load)
        assert a.read_bytes() == b.read_bytes() and a.stat().st_size > 1000
