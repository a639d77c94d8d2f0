"""Routes between GPUs, for up to about a million flows at once, as CSR arrays of link ids.

    router = make_router(graph)                      # picks by graph.graph["routing"]
    indptr, links = router.route_many(src, dst)      # src, dst: GPU index arrays (F,)
    links[indptr[i]:indptr[i + 1]]                   # flow i's link ids, in path order

A link id is the edge's position in list(graph.edges), the order sim.network indexes links in.
Routers are deterministic (a pair always takes the same path) and know nothing of latency or
bandwidth. src == dst gives an empty path. Each topology kind declares the routers its graphs
may name in graph.graph["routing"] (topologies.kind); this module holds what they share: the
CSR helpers, the pair hash, and the default, shortest_path (one networkx BFS per source, cached).
"""

from __future__ import annotations

from typing import Protocol

import networkx as nx
import numpy as np

from clustersim.topologies.schema import ROUTING, gpu_nodes


class Router(Protocol):
    def route_many(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """GPU indices src[i] -> dst[i]. Returns CSR (indptr int64 (F+1,), link_ids int64 (P,)):
        flow i crosses links link_ids[indptr[i]:indptr[i+1]] in path order."""
        ...


def link_index(graph: nx.DiGraph) -> dict[tuple, int]:
    """(u, v) -> link id, the edge's position in list(graph.edges)."""
    return {edge: i for i, edge in enumerate(graph.edges)}


def check_pairs(src, dst, num_gpus: int) -> tuple[np.ndarray, np.ndarray]:
    src, dst = np.asarray(src, dtype=np.int64).ravel(), np.asarray(dst, dtype=np.int64).ravel()
    if src.shape != dst.shape:
        raise ValueError(f"src and dst differ in length: {src.size} != {dst.size}")
    if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= num_gpus):
        raise ValueError(f"GPU indices must be in 0..{num_gpus - 1}")
    return src, dst


def csr(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """indptr for per-flow path lengths, and an uninitialised link id array to fill."""
    indptr = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    return indptr, np.empty(int(indptr[-1]), dtype=np.int64)


class ShortestPathRouter:
    """Fewest hops, ties broken by networkx's BFS order (deterministic: graph insertion order).
    One BFS per distinct source GPU, cached; fine for small graphs (switch, dgx)."""

    def __init__(self, graph: nx.DiGraph):
        self.graph = graph
        self._links = link_index(graph)
        self._gpus = gpu_nodes(graph)
        self._from: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # src -> (ptr (N+1,), flat links)

    def _paths_from(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        if s not in self._from:
            paths = nx.single_source_shortest_path(self.graph, self._gpus[s])
            per_dst = [[self._links[e] for e in zip(p[:-1], p[1:])] for p in (paths[node] for node in self._gpus)]
            ptr = np.zeros(len(per_dst) + 1, dtype=np.int64)
            np.cumsum([len(p) for p in per_dst], out=ptr[1:])
            self._from[s] = (ptr, np.fromiter((link for p in per_dst for link in p), np.int64, int(ptr[-1])))
        return self._from[s]

    def route_many(self, src, dst) -> tuple[np.ndarray, np.ndarray]:
        src, dst = check_pairs(src, dst, len(self._gpus))
        if not src.size:
            return csr(np.zeros(0, np.int64))
        sources, which = np.unique(src, return_inverse=True)
        tables = [self._paths_from(int(s)) for s in sources]
        offsets = np.cumsum([0] + [len(flat) for _, flat in tables])
        starts = np.stack([ptr[:-1] + off for (ptr, _), off in zip(tables, offsets)])  # (U, N)
        lens = np.stack([np.diff(ptr) for ptr, _ in tables])  # (U, N)
        flat = np.concatenate([flat for _, flat in tables] + [np.empty(0, np.int64)])
        start, length = starts[which, dst], lens[which, dst]
        indptr, links = csr(length)
        links[:] = flat[np.repeat(start - indptr[:-1], length) + np.arange(links.size)]
        return indptr, links


def flow_hash(src: np.ndarray, dst: np.ndarray, num_gpus: int) -> np.ndarray:
    """A deterministic uint64 hash of each (src, dst): splitmix64's finaliser (xor-shift and
    multiply by odd constants, wrapping mod 2^64) of src * num_gpus + dst. Every bit of the pair
    reaches the low bits, so `hash % choices` spreads all-pairs traffic evenly over choices."""
    z = src.astype(np.uint64) * np.uint64(num_gpus) + dst.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


SHORTEST_PATH = "shortest_path"


def make_router(graph: nx.DiGraph) -> Router:
    """The router graph.graph["routing"] names (default shortest_path), among the routers the
    registered kinds declare; a miss lists the names."""
    from clustersim.topologies.registry import ROUTERS  # the kinds import this module

    name = graph.graph.get(ROUTING, SHORTEST_PATH)
    if name not in ROUTERS:
        raise ValueError(f"unknown routing {name!r} (valid: {', '.join(ROUTERS)})")
    return ROUTERS[name](graph)
