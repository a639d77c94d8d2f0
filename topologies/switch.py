"""One switch with every GPU on its own full-duplex link: an NVSwitch node, or any crossbar."""

from __future__ import annotations

import networkx as nx

from clustersim.topologies.schema import GPU_INDEX, KIND, add_duplex_link


def switch(num_gpus: int, bandwidth_Bps: float, latency_s: float, switch_kind: str = "nvswitch") -> nx.DiGraph:
    """GPUs 0..N-1 (nodes ("gpu", i)) each linked to one switch node ("switch", 0).

    A message between two GPUs crosses two links (GPU -> switch -> GPU), so its latency is
    2 x latency_s and two messages share a link only when they leave, or enter, the same GPU.
    """
    graph = nx.DiGraph()
    hub = ("switch", 0)
    graph.add_node(hub, **{KIND: switch_kind})
    for i in range(num_gpus):
        graph.add_node(("gpu", i), **{KIND: "gpu", GPU_INDEX: i})
        add_duplex_link(graph, ("gpu", i), hub, bandwidth_Bps, latency_s)
    return graph
