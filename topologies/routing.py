"""Routes between GPUs, for up to about a million flows at once, as CSR arrays of link ids.

    router = make_router(graph)                      # picks by graph.graph["routing"]
    indptr, links = router.route_many(src, dst)      # src, dst: GPU index arrays (F,)
    links[indptr[i]:indptr[i + 1]]                   # flow i's link ids, in path order

A link id is the edge's position in list(graph.edges), the order sim.network indexes links in.
Routers are deterministic (a pair always takes the same path) and know nothing of latency or
bandwidth. src == dst gives an empty path. The routers, by graph.graph["routing"]:

  shortest_path   (default: switch, dgx)   ShortestPathRouter: one networkx BFS per source, cached
  dimension_order (ring, torus, mesh)      DimensionOrderRouter: axis 0, then 1, then 2
  ecmp            (fattree)                EcmpRouter: spine (and core) by a hash of (src, dst)
"""

from __future__ import annotations

import math
from typing import Protocol

import networkx as nx
import numpy as np

from clustersim.topologies import fattree as ft
from clustersim.topologies.schema import AXES, ROUTING, WRAP, gpu_nodes


class Router(Protocol):
    def route_many(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """GPU indices src[i] -> dst[i]. Returns CSR (indptr int64 (F+1,), link_ids int64 (P,)):
        flow i crosses links link_ids[indptr[i]:indptr[i+1]] in path order."""
        ...


def link_index(graph: nx.DiGraph) -> dict[tuple, int]:
    """(u, v) -> link id, the edge's position in list(graph.edges)."""
    return {edge: i for i, edge in enumerate(graph.edges)}


def _pairs(src, dst, num_gpus: int) -> tuple[np.ndarray, np.ndarray]:
    src, dst = np.asarray(src, dtype=np.int64).ravel(), np.asarray(dst, dtype=np.int64).ravel()
    if src.shape != dst.shape:
        raise ValueError(f"src and dst differ in length: {src.size} != {dst.size}")
    if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= num_gpus):
        raise ValueError(f"GPU indices must be in 0..{num_gpus - 1}")
    return src, dst


def _csr(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
        src, dst = _pairs(src, dst, len(self._gpus))
        if not src.size:
            return _csr(np.zeros(0, np.int64))
        sources, which = np.unique(src, return_inverse=True)
        tables = [self._paths_from(int(s)) for s in sources]
        offsets = np.cumsum([0] + [len(flat) for _, flat in tables])
        starts = np.stack([ptr[:-1] + off for (ptr, _), off in zip(tables, offsets)])  # (U, N)
        lens = np.stack([np.diff(ptr) for ptr, _ in tables])  # (U, N)
        flat = np.concatenate([flat for _, flat in tables] + [np.empty(0, np.int64)])
        start, length = starts[which, dst], lens[which, dst]
        indptr, links = _csr(length)
        links[:] = flat[np.repeat(start - indptr[:-1], length) + np.arange(links.size)]
        return indptr, links


class DimensionOrderRouter:
    """Dimension-order routing on a torus or mesh (graph.graph["axes"], ["wrap"]).

    Correct axis 0 fully, then axis 1, then axis 2. On a torus each axis goes the shorter way
    round, d = (dst - src) mod k hops + or k - d hops -; a tie (d = k/2 exactly) goes + (towards
    increasing coordinate). On a mesh there is one way. So a path has sum_a min(d_a, k_a - d_a)
    links on a torus and sum_a |d_a| on a mesh.

    Vectorised: tables next link / next GPU per (GPU, axis, direction), and every flow still
    moving along the current axis takes one hop per numpy step (at most sum_a k_a / 2 steps).
    """

    def __init__(self, graph: nx.DiGraph):
        self.axes, self.wrap = tuple(graph.graph[AXES]), bool(graph.graph[WRAP])
        num = math.prod(self.axes)
        ids, gpus = link_index(graph), gpu_nodes(graph)
        if len(gpus) != num:
            raise ValueError(f"graph has {len(gpus)} GPUs, axes {self.axes} need {num}")
        coords = np.stack(np.unravel_index(np.arange(num), self.axes), axis=1)  # (N, A)
        shape = (num, len(self.axes), 2)  # direction 0 is +, 1 is -
        self._next_link, self._next_gpu = np.full(shape, -1, np.int64), np.full(shape, -1, np.int64)
        for a, k in enumerate(self.axes):
            for direction, step in ((0, 1), (1, -1)):
                moved = coords.copy()
                moved[:, a] += step
                ok = (k > 1) & (self.wrap | ((moved[:, a] >= 0) & (moved[:, a] < k)))
                moved[:, a] %= k
                nxt = np.ravel_multi_index(tuple(moved.T), self.axes)
                for i in np.flatnonzero(ok):
                    self._next_gpu[i, a, direction] = nxt[i]
                    self._next_link[i, a, direction] = ids[(gpus[i], gpus[nxt[i]])]
        self._next_link, self._next_gpu = self._next_link.ravel(), self._next_gpu.ravel()

    def hops(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(steps (A, F), minus (A, F) bool): hops per axis and whether they go in the - direction."""
        cs, cd = np.unravel_index(src, self.axes), np.unravel_index(dst, self.axes)
        steps = np.empty((len(self.axes), src.size), np.int64)
        minus = np.empty((len(self.axes), src.size), bool)
        for a, k in enumerate(self.axes):
            if self.wrap:
                d = (cd[a] - cs[a]) % k
                minus[a] = 2 * d > k  # a tie, 2d == k, goes +
                steps[a] = np.where(minus[a], k - d, d)
            else:
                d = cd[a] - cs[a]
                minus[a], steps[a] = d < 0, np.abs(d)
        return steps, minus

    def route_many(self, src, dst) -> tuple[np.ndarray, np.ndarray]:
        src, dst = _pairs(src, dst, math.prod(self.axes))
        steps, minus = self.hops(src, dst)
        indptr, links = _csr(steps.sum(axis=0))
        cur, pos = src.copy(), indptr[:-1].copy()
        width = 2 * len(self.axes)
        for a in range(len(self.axes)):
            act = np.flatnonzero(steps[a])
            node, at, left = cur[act], pos[act], steps[a, act]
            slot = 2 * a + minus[a, act]
            while act.size:
                key = node * width + slot
                links[at] = self._next_link[key]
                node, at, left = self._next_gpu[key], at + 1, left - 1
                done = left == 0
                if done.any():
                    cur[act[done]], pos[act[done]] = node[done], at[done]
                    keep = ~done
                    act, node, at, left, slot = act[keep], node[keep], at[keep], left[keep], slot[keep]
        return indptr, links


def flow_hash(src: np.ndarray, dst: np.ndarray, num_gpus: int) -> np.ndarray:
    """A deterministic uint64 hash of each (src, dst): splitmix64's finaliser (xor-shift and
    multiply by odd constants, wrapping mod 2^64) of src * num_gpus + dst. Every bit of the pair
    reaches the low bits, so `hash % choices` spreads all-pairs traffic evenly over choices."""
    z = src.astype(np.uint64) * np.uint64(num_gpus) + dst.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class EcmpRouter:
    """Equal-cost multipath on topologies.fattree's rail-optimised fat tree.

    h = flow_hash(src, dst); spine j = h mod S; in three tiers core c = (h div S) mod G (G cores per
    plane). Paths (links): same node 2 (GPU, NVSwitch, GPU); same leaf 4 (GPU, NIC, leaf, NIC, GPU);
    via a spine 6; via a core (three tiers, different pods) 8. Each is a fewest-hop path.
    """

    def __init__(self, graph: nx.DiGraph):
        g = graph.graph
        nodes, per, self.tiers = g[ft.NODES], g[ft.GPUS_PER_NODE], g[ft.TIERS]
        self.spines, radix, groups = g[ft.SPINES], g["leaf_radix"], g[ft.LEAVES_PER_RAIL]
        self.num_gpus, self.per_node = nodes * per, per
        ids = link_index(graph)
        gpu = np.arange(self.num_gpus)
        self.node, rail = gpu // per, gpu % per
        self.group = self.node // radix
        self.leaf = rail * groups + self.group  # leaf number (rail, group) -> r * L + group

        def table(pairs) -> np.ndarray:
            return np.array([ids[p] for p in pairs], dtype=np.int64)

        nv, nic = [ft.nvswitch_id(int(n)) for n in self.node], [ft.nic_id(int(x)) for x in gpu]
        gp, lf = [ft.gpu_id(int(x)) for x in gpu], [ft.leaf_id(int(r), int(q)) for r, q in zip(rail, self.group)]
        self.gpu_nv, self.nv_gpu = table(zip(gp, nv)), table(zip(nv, gp))
        self.gpu_nic, self.nic_gpu = table(zip(gp, nic)), table(zip(nic, gp))
        self.nic_leaf, self.leaf_nic = table(zip(nic, lf)), table(zip(lf, nic))
        leaves = [(r, q) for r in range(per) for q in range(groups)]  # in leaf-number order
        top = [[ft.spine_id(q if self.tiers == 3 else 0, j) for j in range(self.spines)] for _, q in leaves]
        self.leaf_up = np.array([table((ft.leaf_id(r, q), s) for s in row) for (r, q), row in zip(leaves, top)])
        self.leaf_down = np.array([table((s, ft.leaf_id(r, q)) for s in row) for (r, q), row in zip(leaves, top)])
        if self.tiers == 3:  # (pod, j, c)
            self.spine_up = np.array(
                [
                    [table((ft.spine_id(q, j), ft.core_id(j, c)) for c in range(per)) for j in range(self.spines)]
                    for q in range(groups)
                ]
            )
            self.spine_down = np.array(
                [
                    [table((ft.core_id(j, c), ft.spine_id(q, j)) for c in range(per)) for j in range(self.spines)]
                    for q in range(groups)
                ]
            )

    def route_many(self, src, dst) -> tuple[np.ndarray, np.ndarray]:
        src, dst = _pairs(src, dst, self.num_gpus)
        h = flow_hash(src, dst, self.num_gpus)
        spine = (h % np.uint64(self.spines)).astype(np.int64)
        core = (h // np.uint64(self.spines) % np.uint64(self.per_node)).astype(np.int64)
        same_node = self.node[src] == self.node[dst]
        same_leaf = ~same_node & (self.leaf[src] == self.leaf[dst])
        cross_pod = (self.group[src] != self.group[dst]) if self.tiers == 3 else np.zeros(src.size, bool)
        length = np.select([src == dst, same_node, same_leaf, cross_pod], [0, 2, 4, 8], default=6)
        indptr, links = _csr(length)
        for kind_len in (2, 4, 6, 8):
            idx = np.flatnonzero(length == kind_len)
            if not idx.size:
                continue
            s, d, j, c = src[idx], dst[idx], spine[idx], core[idx]
            if kind_len == 2:
                columns = [self.gpu_nv[s], self.nv_gpu[d]]
            else:
                up, down = [self.gpu_nic[s], self.nic_leaf[s]], [self.leaf_nic[d], self.nic_gpu[d]]
                ls, ld = self.leaf[s], self.leaf[d]
                if kind_len == 4:
                    middle = []
                elif kind_len == 6:
                    middle = [self.leaf_up[ls, j], self.leaf_down[ld, j]]
                else:
                    middle = [
                        self.leaf_up[ls, j],
                        self.spine_up[self.group[s], j, c],
                        self.spine_down[self.group[d], j, c],
                        self.leaf_down[ld, j],
                    ]
                columns = up + middle + down
            start = indptr[idx]
            for k, column in enumerate(columns):
                links[start + k] = column
        return indptr, links


ROUTERS = {"shortest_path": ShortestPathRouter, "dimension_order": DimensionOrderRouter, "ecmp": EcmpRouter}


def make_router(graph: nx.DiGraph) -> Router:
    """The router graph.graph["routing"] names (default "shortest_path"); a miss lists the names."""
    name = graph.graph.get(ROUTING, "shortest_path")
    if name not in ROUTERS:
        raise ValueError(f"unknown routing {name!r} (valid: {', '.join(ROUTERS)})")
    return ROUTERS[name](graph)
