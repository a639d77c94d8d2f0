"""topologies/dragonfly.py: the graph follows the schema and the link-count formula; minimal routes
take the closed-form router hops, Valiant routes at most 5 with two global hops; both are
deterministic; scenarios, specs and the CLI reach it."""

import numpy as np
import pytest

from clustersim.sim.build import build_topology
from clustersim.sim.cli import main
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario_text
from clustersim.sim.scenario.schema import ScenarioError
from clustersim.sim.scenario.spec import parse_spec
from clustersim.topologies.dragonfly import dragonfly, global_router
from clustersim.topologies.routing import make_router
from clustersim.topologies.schema import KIND, check_schema, gpu_nodes

BW, LAT = 25e9, 1e-6
SHAPES = [  # (g, a, p, h)
    (1, 1, 1, 1),
    (1, 4, 2, 2),
    (2, 2, 1, 1),
    (3, 2, 1, 1),  # g = a h + 1: every global port used
    (4, 4, 2, 2),  # the balanced a = 2p = 2h, 4 of up to 9 groups
    (9, 4, 2, 2),  # the balanced one at its full size
    (4, 3, 2, 1),  # g = a h + 1 again, three routers a group
]


def build(g, a, p, h, routing="minimal"):
    return dragonfly(g, a, p, h, BW, 2 * BW, LAT, routing)


def routes(graph):
    """All ordered GPU pairs s != d, with each route as its list of directed edges."""
    n = len(gpu_nodes(graph))
    s, d = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    keep = s != d
    s, d = s[keep], d[keep]
    edges = list(graph.edges)
    indptr, links = make_router(graph).route_many(s, d)
    paths = [[edges[k] for k in links[indptr[i] : indptr[i + 1]]] for i in range(s.size)]
    for i, path in enumerate(paths):
        assert path[0][0] == ("gpu", s[i]) and path[-1][1] == ("gpu", d[i])
        assert all(v == u for (_, v), (u, _) in zip(path, path[1:])), path  # links chain
    return s, d, paths


def router_hops(path) -> int:
    return len(path) - 2  # all but the GPU -> router and router -> GPU links


def global_hops(path) -> int:
    return sum(u[0] == v[0] == "router" and u[1] != v[1] for u, v in path)


@pytest.mark.parametrize("g,a,p,h", SHAPES)
def test_graph_passes_the_schema_and_the_link_count_formula(g, a, p, h):
    """Duplex links: g a p (GPU-router) + g a (a - 1) / 2 (local) + g (g - 1) / 2 (global)."""
    graph = build(g, a, p, h)
    check_schema(graph)
    assert graph.number_of_edges() == 2 * (g * a * p + g * a * (a - 1) // 2 + g * (g - 1) // 2)
    kinds = [kind for _, kind in graph.nodes(data=KIND)]
    assert (kinds.count("gpu"), kinds.count("router")) == (g * a * p, g * a)
    between = [(u, v) for u, v in graph.edges if u[0] == v[0] == "router" and u[1] != v[1]]
    assert sorted((u[1], v[1]) for u, v in between) == [(x, y) for x in range(g) for y in range(g) if x != y]
    for router in (n for n, kind in graph.nodes(data=KIND) if kind == "router"):  # at most h global ports
        assert sum(v[0] == "router" and v[1] != router[1] for v in graph.successors(router)) <= h


def test_builder_rejects_more_groups_than_global_ports():
    with pytest.raises(ValueError, match=r"10 groups need more global ports than a x h = 4 x 2 = 8"):
        build(10, 4, 2, 2)


@pytest.mark.parametrize("g,a,p,h", SHAPES)
def test_minimal_router_hops_by_case(g, a, p, h):
    """Same router 0 router-to-router hops, same group 1, other group 1 + [source router is not
    the one holding the global link] + [destination router is not where it lands]: at most 3."""
    s, d, paths = routes(build(g, a, p, h))
    for src, dst, path in zip(s, d, paths):
        rs, rd = src // p, dst // p
        gs, gd = rs // a, rd // a
        if rs == rd:
            expected = 0
        elif gs == gd:
            expected = 1
        else:
            expected = 1 + (rs % a != global_router(gs, gd, g, h)) + (rd % a != global_router(gd, gs, g, h))
        assert router_hops(path) == expected <= 3, (src, dst, path)
        assert global_hops(path) == (gs != gd)


@pytest.mark.parametrize("g,a,p,h", SHAPES)
def test_mean_minimal_router_hops_is_the_closed_form(g, a, p, h):
    """Over all N (N - 1) ordered pairs, N = g a p. From one GPU: p - 1 GPUs on its router (0
    hops), (a - 1) p in its group (1 hop). For an ordered pair of groups with exit router e and
    entry router f, the a^2 router pairs take a^2 x 1 + a (a - 1) [source != e] + a (a - 1)
    [destination != f] = a (3a - 2) hops, each router pair carrying p^2 GPU pairs. So

        mean = (N (a - 1) p + g (g - 1) p^2 a (3a - 2)) / (N (N - 1))
             = p ((a - 1) + (g - 1)(3a - 2)) / (g a p - 1),

    whatever the port layout (only one exit router per group pair matters)."""
    _, _, paths = routes(build(g, a, p, h))
    n = g * a * p
    if n == 1:
        assert not paths
        return
    closed = p * ((a - 1) + (g - 1) * (3 * a - 2)) / (n - 1)
    assert np.mean([router_hops(path) for path in paths]) == pytest.approx(closed, rel=1e-12)


@pytest.mark.parametrize("g,a,p,h", SHAPES)
def test_valiant_detours_through_a_third_group(g, a, p, h):
    """Across groups (g >= 3): two global hops via an intermediate group that is neither end,
    at most 5 router hops, never fewer global hops than minimal; inside a group: the minimal
    route. Over all pairs Valiant is longer on average, and it uses every intermediate group."""
    s, d, minimal = routes(build(g, a, p, h))
    _, _, valiant = routes(build(g, a, p, h, "valiant"))
    via = []
    for src, dst, short, long in zip(s, d, minimal, valiant):
        gs, gd = src // p // a, dst // p // a
        assert router_hops(long) <= 5 and global_hops(long) >= global_hops(short)
        if gs == gd or g < 3:
            assert long == short
            continue
        assert global_hops(long) == 2
        middle = {u[1] for u, v in long if u[0] == v[0] == "router"} - {gs, gd}
        assert len(middle) == 1, long
        via.append(middle.pop())
    if via:
        assert np.mean([router_hops(x) for x in valiant]) > np.mean([router_hops(x) for x in minimal])
        assert set(via) == set(range(g))


def test_routes_are_deterministic():
    graph = build(4, 4, 2, 2, "valiant")
    s, d = np.arange(32).repeat(32), np.tile(np.arange(32), 32)
    first, again = make_router(graph).route_many(s, d), make_router(build(4, 4, 2, 2, "valiant")).route_many(s, d)
    assert all(np.array_equal(x, y) for x, y in zip(first, again))


SCENARIO = """
name: df
cluster:
  gpu: H100-SXM
  nodes: {nodes}
  gpus_per_node: 2
  topology: {{kind: dragonfly, routers_per_group: 4, global_links_per_router: {h}, link_bandwidth: 25GB/s,
             global_bandwidth: 50GB/s, link_latency: 1us, routing: {routing}}}
model: {{layers: 4, hidden: 256, heads: 4, seq_len: 64, vocab: 100}}
training: {{global_batch: {batch}, micro_batch: 1}}
parallel: {{pp: 4, dp: {dp}, order: [pp, dp, tp]}}
numerics: {{enabled: false}}
"""


def scenario(nodes=8, h=2, routing="valiant"):
    dp = nodes * 2 // 4
    return load_scenario_text(SCENARIO.format(nodes=nodes, h=h, routing=routing, dp=dp, batch=2 * dp), "df.yaml")


def test_scenario_builds_the_dragonfly_and_runs_bit_identically():
    s = scenario()
    graph = build_topology(s)
    check_schema(graph)
    assert (graph.graph["g"], graph.graph["routing"], len(gpu_nodes(graph))) == (2, "valiant", 16)
    assert s.resolved()["cluster"]["topology"]["global_bandwidth_Bps"] == 50e9
    assert simulate(s).summary == simulate(scenario()).summary


@pytest.mark.parametrize(
    "nodes,h,routing,path,reason",
    [
        (6, 2, "minimal", "cluster.nodes", r"6 routers \(one per node\) do not fill groups of"),
        (8, 0, "minimal", "cluster.topology.global_links_per_router", "must be > 0"),
        (40, 2, "minimal", "cluster.nodes", r"40 / 4 = 10 groups, more than .* \+ 1 = 9"),
        (8, 2, "ugal", "cluster.topology.routing", "'minimal' or 'valiant'"),
    ],
)
def test_scenario_rejects_a_dragonfly_that_does_not_fit(nodes, h, routing, path, reason):
    with pytest.raises(ScenarioError, match=f"^df.yaml: {path}: .*{reason}"):
        scenario(nodes, h, routing)


def test_spec_and_cli_reach_the_dragonfly(tmp_path, capsys):
    graph = parse_spec("dragonfly:nodes=16,routing=valiant,global_bandwidth=50GB/s")
    assert len(gpu_nodes(graph)) == 32 and graph.graph["routing"] == "valiant"
    sizes = ["--sizes", "1MiB:4MiB"]
    assert main(["collective", "all_reduce", "--topology", "dragonfly:nodes=8", *sizes, "--routing", "valiant"]) == 0
    assert "all_reduce on dragonfly:nodes=8 (16 GPUs)" in capsys.readouterr().out
    assert main(["topology", "dragonfly:nodes=16", "-o", str(tmp_path / "df.png")]) == 0
    assert "48 nodes (32 gpu, 16 router), 62 links" in capsys.readouterr().out
    assert (tmp_path / "df.png").read_bytes()[:4] == b"\x89PNG"
