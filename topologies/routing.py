"""Routes between GPUs as lists of directed edges: shortest path by hop count, ties broken by
networkx's deterministic BFS order (later issues add dimension-order and ECMP routing)."""

from __future__ import annotations

from typing import Protocol

import networkx as nx
import numpy as np

from topologies.schema import gpu_nodes


def shortest_path_route(graph: nx.DiGraph, src, dst) -> list[tuple]:
    """Directed edges (u, v) from node src to node dst; empty when src == dst."""
    nodes = nx.shortest_path(graph, src, dst)
    return list(zip(nodes[:-1], nodes[1:]))


class Router(Protocol):
    """Routes many flows at once: GPU indices src[i] -> dst[i] (src != dst) to a CSR
    (indptr (F+1,), link_ids (P,)): flow i crosses link_ids[indptr[i]:indptr[i+1]] in path order.
    A link id is the edge's position in list(graph.edges)."""

    def route_many(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


class ShortestPathRouter:
    """networkx shortest path per distinct (src, dst), cached; for small graphs."""

    def __init__(self, graph: nx.DiGraph):
        self.graph = graph
        self.link_index = {edge: i for i, edge in enumerate(graph.edges)}
        self.gpu_node = gpu_nodes(graph)
        self._cache: dict[tuple[int, int], list[int]] = {}

    def _path(self, src: int, dst: int) -> list[int]:
        key = (src, dst)
        if key not in self._cache:
            route = shortest_path_route(self.graph, self.gpu_node[src], self.gpu_node[dst])
            self._cache[key] = [self.link_index[edge] for edge in route]
        return self._cache[key]

    def route_many(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        paths = [self._path(int(s), int(d)) for s, d in zip(src, dst)]
        indptr = np.zeros(len(paths) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in paths], out=indptr[1:])
        return indptr, np.fromiter((l for p in paths for l in p), dtype=np.int64, count=int(indptr[-1]))


def make_router(graph: nx.DiGraph) -> Router:
    """The router a graph asks for in graph.graph["routing"] (default: shortest path)."""
    kind = graph.graph.get("routing", "shortest_path")
    routers = {"shortest_path": ShortestPathRouter}
    if kind not in routers:
        raise ValueError(f"unknown routing {kind!r} (valid: {', '.join(routers)})")
    return routers[kind](graph)
