"""The graph schema every topology builder follows, in one place.

A topology is a `networkx.DiGraph`. Nodes carry `kind` (one of NODE_KINDS) and, for GPUs, `gpu`
(the GPU's index 0..N-1, which is also the node id's order). A full-duplex link is two directed
edges, each with `bandwidth` (bytes/s, one direction) and `latency` (seconds). Runtime state
(flows, rates) never lives on the graph.

Graph-level attributes (`graph.graph[...]`) tell a router and a plot what the graph is:
TOPOLOGY names the kind (topologies.registry; absent on a switch built by hand), ROUTING names a router
one of the kinds declares (absent means "shortest_path"), and each builder adds what its router
needs (torus/mesh/ring: AXES, WRAP; others: see their modules).
"""

from __future__ import annotations

import networkx as nx

KIND = "kind"
GPU_INDEX = "gpu"
BANDWIDTH = "bandwidth"
LATENCY = "latency"

NODE_KINDS = ("gpu", "nvswitch", "switch", "nic", "leaf", "spine", "core", "router")

TOPOLOGY = "topology"
ROUTING = "routing"
AXES = "axes"  # tuple of ints, the torus/mesh size per axis; GPU index = np.ravel_multi_index(coords, axes)
WRAP = "wrap"  # bool: torus (wraparound links) or mesh


def add_duplex_link(graph: nx.DiGraph, a, b, bandwidth_Bps: float, latency_s: float) -> None:
    """Two directed edges a->b and b->a, each with the full one-way bandwidth."""
    graph.add_edge(a, b, **{BANDWIDTH: bandwidth_Bps, LATENCY: latency_s})
    graph.add_edge(b, a, **{BANDWIDTH: bandwidth_Bps, LATENCY: latency_s})


def node_label(node) -> str:
    """A short name for a node id: ("gpu", 3) -> "gpu3", ("leaf", 2, 0) -> "leaf2.0"."""
    if isinstance(node, tuple) and node and isinstance(node[0], str):
        return node[0] + ".".join(str(part) for part in node[1:])
    return str(node)


def gpu_nodes(graph: nx.DiGraph) -> list:
    """GPU node ids ordered by their GPU index."""
    gpus = [(data[GPU_INDEX], node) for node, data in graph.nodes(data=True) if data[KIND] == "gpu"]
    return [node for _, node in sorted(gpus)]


def check_schema(graph: nx.DiGraph) -> None:
    """Raise ValueError if the graph breaks the schema (used by tests on every builder)."""
    for node, data in graph.nodes(data=True):
        if data.get(KIND) not in NODE_KINDS:
            raise ValueError(f"node {node!r}: kind {data.get(KIND)!r} not in {NODE_KINDS}")
        if data[KIND] == "gpu" and not isinstance(data.get(GPU_INDEX), int):
            raise ValueError(f"node {node!r}: gpu node without an integer {GPU_INDEX!r}")
    indices = sorted(graph.nodes[n][GPU_INDEX] for n in gpu_nodes(graph))
    if indices != list(range(len(indices))):
        raise ValueError(f"gpu indices are not 0..{len(indices) - 1}: {indices}")
    for a, b, data in graph.edges(data=True):
        if not data.get(BANDWIDTH, 0) > 0 or data.get(LATENCY, -1) < 0:
            raise ValueError(f"edge {a!r}->{b!r}: needs {BANDWIDTH} > 0 and {LATENCY} >= 0, got {data}")
        if not graph.has_edge(b, a):
            raise ValueError(f"edge {a!r}->{b!r} has no reverse edge (links are full duplex)")
    from clustersim.topologies.registry import ROUTERS  # the kinds import this module

    if graph.graph.get(ROUTING, "shortest_path") not in ROUTERS:
        raise ValueError(f"graph routing {graph.graph[ROUTING]!r} not in {tuple(ROUTERS)}")
    if graph.number_of_nodes() and not nx.is_strongly_connected(graph):
        raise ValueError("topology is not connected")
