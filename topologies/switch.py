"""One switch with every GPU on its own full-duplex link: an NVSwitch node, or any crossbar.

Every GPU looks like every other, so any relabelling of GPUs maps the fabric onto itself: the
simulator may shift replicas freely (`symmetry` is 1 block).
"""

from __future__ import annotations

from typing import Any

import networkx as nx
from pydantic import Field

from clustersim.topologies.kind import Bandwidth, Keys, ReplicaBlocks, Seconds, Shape, SpecForm, TopologyKind
from clustersim.topologies.routing import SHORTEST_PATH, ShortestPathRouter
from clustersim.topologies.schema import GPU_INDEX, KIND, TOPOLOGY, add_duplex_link


def switch(num_gpus: int, bandwidth_Bps: float, latency_s: float, switch_kind: str = "nvswitch") -> nx.DiGraph:
    """GPUs 0..N-1 (nodes ("gpu", i)) each linked to one switch node ("switch", 0).

    A message between two GPUs crosses two links (GPU -> switch -> GPU), so its latency is
    2 x latency_s and two messages share a link only when they leave, or enter, the same GPU.
    """
    graph: nx.DiGraph = nx.DiGraph()
    hub = ("switch", 0)
    graph.add_node(hub, **{KIND: switch_kind})
    for i in range(num_gpus):
        graph.add_node(("gpu", i), **{KIND: "gpu", GPU_INDEX: i})
        add_duplex_link(graph, ("gpu", i), hub, bandwidth_Bps, latency_s)
    return graph


class LinkKeys(Keys):
    """Fabrics of identical links (switch, ring, torus, mesh): one bandwidth, one latency."""

    link_bandwidth_Bps: Bandwidth = Field(alias="link_bandwidth", description="every link, per direction")
    link_latency_s: Seconds = Field(alias="link_latency", description="per link, e.g. '1us'")


# An assumption for specs of link fabrics (a scenario states its own): round numbers, no product.
LINK_SPEC_DEFAULTS = {"link_bandwidth": 100e9, "link_latency": 1e-6}


def gpu_count(text: str) -> dict[str, Any]:
    """A spec's size part as the GPU count of one node: "8" -> 8 GPUs."""
    if not text.isdigit() or int(text) < 1:
        raise ValueError("an integer >= 1")
    return {"gpus_per_node": int(text)}


def _build(keys: LinkKeys, shape: Shape) -> nx.DiGraph:
    graph = switch(shape.num_gpus, keys.link_bandwidth_Bps, keys.link_latency_s)
    graph.graph[TOPOLOGY] = "switch"
    return graph


def _any_shift(keys: LinkKeys, shape: Shape, blocks: ReplicaBlocks) -> int:
    return 1


SWITCH = TopologyKind(
    name="switch",
    keys=LinkKeys,
    build=_build,
    routers={SHORTEST_PATH: ShortestPathRouter},
    spec=SpecForm("a GPU count, e.g. switch:16", gpu_count, LINK_SPEC_DEFAULTS),
    symmetry=_any_shift,
)
