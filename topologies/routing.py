"""Routes between GPUs as lists of directed edges: shortest path by hop count, ties broken by
networkx's deterministic BFS order (later issues add dimension-order and ECMP routing)."""

from __future__ import annotations

import networkx as nx


def shortest_path_route(graph: nx.DiGraph, src, dst) -> list[tuple]:
    """Directed edges (u, v) from node src to node dst; empty when src == dst."""
    nodes = nx.shortest_path(graph, src, dst)
    return list(zip(nodes[:-1], nodes[1:]))
