"""Tori and meshes of GPUs linked directly (TPU-style, no switches), with 1, 2 or 3 axes.

GPU i sits at coordinates c = np.unravel_index(i, axes) (C order: the last axis varies fastest),
so on a 4x4x4 torus GPU 0 is (0, 0, 0), GPU 1 is (0, 0, 1) and GPU 16 is (1, 0, 0). Along axis a
each GPU links to c_a + 1 and c_a - 1; a torus wraps around (k_a - 1 <-> 0), a mesh does not.

Directed edge count, summed over axes (N GPUs, k = k_a):
    torus, k > 2:  2N    (every GPU has a + and a - neighbour)
    torus, k = 2:  N     the + and - neighbours are the same GPU and a DiGraph holds one edge per
                         ordered pair, so the axis is ONE duplex link per pair (a real 2-wide torus
                         ring has two cables; here that axis has half of that bandwidth)
    mesh:          2N (k - 1) / k
    k = 1:         0
Routing metadata: graph.graph["routing"] = "dimension_order", ["axes"] = (k0, ...), ["wrap"].
The scenario keys: `axes` (the product must be the cluster's GPU count), `wrap` (torus only),
`link_bandwidth`, `link_latency`; specs read `torus:4x4x4`, `mesh:4x4`.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

import networkx as nx
import numpy as np
from pydantic import Field, field_validator

from clustersim.topologies.kind import FitError, Shape, SpecForm, TopologyKind
from clustersim.topologies.routing import check_pairs, csr, link_index
from clustersim.topologies.schema import AXES, GPU_INDEX, KIND, ROUTING, TOPOLOGY, WRAP, add_duplex_link, gpu_nodes
from clustersim.topologies.switch import LINK_SPEC_DEFAULTS, LinkKeys

MAX_AXES = 3
DIMENSION_ORDER = "dimension_order"


def check_axes(axes) -> tuple[int, ...]:
    """Axes as a tuple of ints >= 1, 1 to MAX_AXES of them; ValueError otherwise."""
    axes = tuple(axes)
    if not 1 <= len(axes) <= MAX_AXES:
        raise ValueError(f"a torus or mesh has 1 to {MAX_AXES} axes, got {len(axes)}: {axes}")
    if not all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 1 for k in axes):
        raise ValueError(f"axis sizes must be integers >= 1, got {axes}")
    return tuple(int(k) for k in axes)


def torus(axes, bandwidth_Bps: float, latency_s: float, wrap: bool = True) -> nx.DiGraph:
    """k0 x k1 [x k2] GPUs, nodes ("gpu", i); every link `bandwidth_Bps` each way, `latency_s`.

    `wrap=False` gives a mesh (no wraparound links)."""
    axes = check_axes(axes)
    if not bandwidth_Bps > 0 or not latency_s >= 0:
        raise ValueError(f"links need bandwidth_Bps > 0 and latency_s >= 0, got {bandwidth_Bps!r}, {latency_s!r}")
    graph: nx.DiGraph = nx.DiGraph(
        **{TOPOLOGY: "torus" if wrap else "mesh", ROUTING: DIMENSION_ORDER, AXES: axes, WRAP: bool(wrap)}
    )
    num_gpus = math.prod(axes)
    for i in range(num_gpus):
        graph.add_node(("gpu", i), **{KIND: "gpu", GPU_INDEX: i})
    for i in range(num_gpus):
        coords = np.unravel_index(i, axes)
        for axis, k in enumerate(axes):
            c = int(coords[axis])
            if c + 1 < k:  # the + neighbour inside the grid
                up = [int(x) for x in coords]
                up[axis] = c + 1
                add_duplex_link(
                    graph, ("gpu", i), ("gpu", int(np.ravel_multi_index(up, axes))), bandwidth_Bps, latency_s
                )
            elif wrap and k > 2:  # c == k - 1: the wraparound link to 0 (k = 2: it already exists)
                zero = [int(x) for x in coords]
                zero[axis] = 0
                add_duplex_link(
                    graph, ("gpu", i), ("gpu", int(np.ravel_multi_index(zero, axes))), bandwidth_Bps, latency_s
                )
    return graph


def mesh(axes, bandwidth_Bps: float, latency_s: float) -> nx.DiGraph:
    """A torus without wraparound links."""
    return torus(axes, bandwidth_Bps, latency_s, wrap=False)


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
        src, dst = check_pairs(src, dst, math.prod(self.axes))
        steps, minus = self.hops(src, dst)
        indptr, links = csr(steps.sum(axis=0))
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


class MeshKeys(LinkKeys):
    axes: list[Annotated[int, Field(gt=0)]] = Field(
        min_length=1, max_length=MAX_AXES, description="GPUs per axis, e.g. [4, 4, 4]; axis 0 routes first"
    )

    @field_validator("axes", mode="before")
    @classmethod
    def _axes_is_a_short_list(cls, value: Any) -> Any:
        if not isinstance(value, list) or not 1 <= len(value) <= MAX_AXES:
            got = f"{len(value)} axes" if isinstance(value, list) else repr(value)
            raise ValueError(f"expected a list of 1 to {MAX_AXES} axis sizes, e.g. [4, 4, 4], got {got}")
        return value


class TorusKeys(MeshKeys):
    wrap: bool = Field(True, description="wraparound links (default true; false is a mesh)")


def _axes_fit(keys: MeshKeys, shape: Shape) -> None:
    if math.prod(keys.axes) != shape.num_gpus:
        raise FitError(
            "topology.axes",
            f"{' x '.join(map(str, keys.axes))} = {math.prod(keys.axes)} GPUs != {shape.num_gpus} "
            f"(cluster.nodes {shape.nodes} x cluster.gpus_per_node {shape.gpus_per_node})",
        )


def _axes_text(text: str) -> dict[str, Any]:
    """A spec's size part: "4x4x4" -> axes [4, 4, 4]."""
    if not re.fullmatch(r"\d+(x\d+){0,2}", text):
        raise ValueError(f"1 to {MAX_AXES} axes")
    return {"axes": [int(k) for k in text.split("x")]}


TORUS = TopologyKind(
    name="torus",
    keys=TorusKeys,
    build=lambda keys, shape: torus(tuple(keys.axes), keys.link_bandwidth_Bps, keys.link_latency_s, keys.wrap),
    routers={DIMENSION_ORDER: DimensionOrderRouter},
    spec=SpecForm("axis sizes, e.g. torus:4x4x4", _axes_text, LINK_SPEC_DEFAULTS),
    fits=_axes_fit,
    gpus=lambda keys: math.prod(keys.axes),
)
MESH = TopologyKind(
    name="mesh",
    keys=MeshKeys,
    build=lambda keys, shape: mesh(tuple(keys.axes), keys.link_bandwidth_Bps, keys.link_latency_s),
    routers={DIMENSION_ORDER: DimensionOrderRouter},
    spec=SpecForm("axis sizes, e.g. mesh:4x4", _axes_text, LINK_SPEC_DEFAULTS),
    fits=_axes_fit,
    gpus=lambda keys: math.prod(keys.axes),
)
