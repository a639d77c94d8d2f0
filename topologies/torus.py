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
"""

from __future__ import annotations

import math

import networkx as nx
import numpy as np

from clustersim.topologies.schema import AXES, GPU_INDEX, KIND, ROUTING, TOPOLOGY, WRAP, add_duplex_link

MAX_AXES = 3


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
    graph = nx.DiGraph(
        **{TOPOLOGY: "torus" if wrap else "mesh", ROUTING: "dimension_order", AXES: axes, WRAP: bool(wrap)}
    )
    num_gpus = math.prod(axes)
    for i in range(num_gpus):
        graph.add_node(("gpu", i), **{KIND: "gpu", GPU_INDEX: i})
    for i in range(num_gpus):
        coords = np.unravel_index(i, axes)
        for axis, k in enumerate(axes):
            c = int(coords[axis])
            if c + 1 < k:  # the + neighbour inside the grid
                up = list(coords)
                up[axis] = c + 1
                add_duplex_link(
                    graph, ("gpu", i), ("gpu", int(np.ravel_multi_index(up, axes))), bandwidth_Bps, latency_s
                )
            elif wrap and k > 2:  # c == k - 1: the wraparound link to 0 (k = 2: it already exists)
                zero = list(coords)
                zero[axis] = 0
                add_duplex_link(
                    graph, ("gpu", i), ("gpu", int(np.ravel_multi_index(zero, axes))), bandwidth_Bps, latency_s
                )
    return graph


def mesh(axes, bandwidth_Bps: float, latency_s: float) -> nx.DiGraph:
    """A torus without wraparound links."""
    return torus(axes, bandwidth_Bps, latency_s, wrap=False)
