"""A bidirectional ring of GPUs linked directly: GPU i <-> GPU (i + 1) mod N.

It is the one-axis torus, so it routes the same way: the shorter direction round the ring, a tie
(distance exactly N/2) going + (increasing index). N = 2 is one duplex link, N = 1 no link.
"""

from __future__ import annotations

import networkx as nx

from clustersim.topologies.kind import Shape, SpecForm, TopologyKind
from clustersim.topologies.schema import TOPOLOGY
from clustersim.topologies.switch import LINK_SPEC_DEFAULTS, LinkKeys, gpu_count
from clustersim.topologies.torus import DIMENSION_ORDER, DimensionOrderRouter, torus


def ring(num_gpus: int, bandwidth_Bps: float, latency_s: float) -> nx.DiGraph:
    """GPUs ("gpu", 0..N-1) on a ring; every link `bandwidth_Bps` each way and `latency_s`."""
    graph = torus((num_gpus,), bandwidth_Bps, latency_s, wrap=True)
    graph.graph[TOPOLOGY] = "ring"
    return graph


def _build(keys: LinkKeys, shape: Shape) -> nx.DiGraph:
    return ring(shape.num_gpus, keys.link_bandwidth_Bps, keys.link_latency_s)


RING = TopologyKind(
    name="ring",
    keys=LinkKeys,
    build=_build,
    routers={DIMENSION_ORDER: DimensionOrderRouter},
    spec=SpecForm("a GPU count, e.g. ring:8", gpu_count, LINK_SPEC_DEFAULTS),
)
