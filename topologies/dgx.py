"""A DGX-style node: GPUs on one NVSwitch, one NIC per GPU (the fat tree, topologies.fattree, joins them).

One node n (G = gpus_per_node GPUs; GPU g = n * G + r has local index r, its "rail"):

    GPU g <-> NVSwitch n   nvlink_bandwidth_Bps   (the node's NVSwitch chips modelled as one crossbar)
    GPU g <-> NIC g        nic_bandwidth_Bps      (PCIe Gen5 x16, ~64 GB/s each way, is faster than
                                                   the NIC, so the NIC's rate is the one that binds)

A lone node (`dgx`) routes by shortest path: GPU -> NVSwitch -> GPU is the only way.

Sources for the defaults (DGX H100):
- NVLINK4_BANDWIDTH_Bps: H100 SXM NVLink 4 is 900 GB/s per GPU counting both directions (18 links),
  450 GB/s each way (NVIDIA H100 datasheet; DGX H100 user guide).
- CX7_BANDWIDTH_Bps: DGX H100 has 8 ConnectX-7 NICs, one per GPU, 400 Gb/s NDR each: 400e9 / 8 bits
  per byte = 50 GB/s each way (NVIDIA DGX H100 datasheet).
- HOP_LATENCY_s: 1 us per link is an assumption (order of a switch hop plus NIC/PCIe time), not a
  measured figure; scenarios state their own.
"""

from __future__ import annotations

import networkx as nx
from pydantic import Field

from clustersim.topologies.kind import Bandwidth, FitError, Keys, Seconds, Shape, SpecForm, TopologyKind
from clustersim.topologies.routing import SHORTEST_PATH, ShortestPathRouter
from clustersim.topologies.schema import GPU_INDEX, KIND, ROUTING, TOPOLOGY, add_duplex_link

NVLINK4_BANDWIDTH_Bps = 450e9
CX7_BANDWIDTH_Bps = 400e9 / 8
HOP_LATENCY_s = 1e-6
DGX_GPUS = 8

# graph.graph keys of a node's structure (fabric descriptions read GPUS_PER_NODE: GPU g is on node g // it)
NODES, GPUS_PER_NODE = "nodes", "gpus_per_node"


def gpu_id(g: int) -> tuple:
    return ("gpu", g)


def nvswitch_id(node: int) -> tuple:
    return ("nvswitch", node)


def nic_id(g: int) -> tuple:
    return ("nic", g)


def _add_dgx(
    graph: nx.DiGraph,
    node: int,
    gpus_per_node: int,
    nvlink_bandwidth_Bps: float,
    nic_bandwidth_Bps: float,
    latency_s: float,
) -> None:
    """Node `node`'s GPUs, its NVSwitch and one NIC per GPU."""
    if not latency_s >= 0:
        raise ValueError(f"latency_s must be >= 0, got {latency_s!r}")
    graph.add_node(nvswitch_id(node), **{KIND: "nvswitch"})
    for r in range(gpus_per_node):
        g = node * gpus_per_node + r
        graph.add_node(gpu_id(g), **{KIND: "gpu", GPU_INDEX: g})
        graph.add_node(nic_id(g), **{KIND: "nic"})
        add_duplex_link(graph, gpu_id(g), nvswitch_id(node), nvlink_bandwidth_Bps, latency_s)
        add_duplex_link(graph, gpu_id(g), nic_id(g), nic_bandwidth_Bps, latency_s)


def dgx_node(
    gpus_per_node: int = DGX_GPUS,
    nvlink_bandwidth_Bps: float = NVLINK4_BANDWIDTH_Bps,
    nic_bandwidth_Bps: float = CX7_BANDWIDTH_Bps,
    latency_s: float = HOP_LATENCY_s,
) -> nx.DiGraph:
    """One DGX-style node on its own: GPUs on an NVSwitch, NICs attached but leading nowhere.
    GPU-to-GPU paths are unique (GPU -> NVSwitch -> GPU), so it routes by shortest path."""
    check_int(gpus_per_node=gpus_per_node)
    check_positive(
        gpus_per_node=gpus_per_node, nvlink_bandwidth_Bps=nvlink_bandwidth_Bps, nic_bandwidth_Bps=nic_bandwidth_Bps
    )
    graph: nx.DiGraph = nx.DiGraph()
    graph.graph.update({TOPOLOGY: "dgx", ROUTING: SHORTEST_PATH, NODES: 1, GPUS_PER_NODE: gpus_per_node})
    _add_dgx(graph, 0, gpus_per_node, nvlink_bandwidth_Bps, nic_bandwidth_Bps, latency_s)
    return graph


def check_positive(**values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")


def check_int(**values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, got {value!r}")


class NodeKeys(Keys):
    """A DGX-style node's links (dgx, and the nodes of a fat tree)."""

    nvlink_bandwidth_Bps: Bandwidth = Field(
        NVLINK4_BANDWIDTH_Bps, alias="nvlink_bandwidth", description="GPU <-> NVSwitch per direction (default 450GB/s)"
    )
    nic_bandwidth_Bps: Bandwidth = Field(
        CX7_BANDWIDTH_Bps, alias="nic_bandwidth", description="GPU <-> NIC <-> leaf per direction (default 50GB/s)"
    )
    link_latency_s: Seconds = Field(alias="link_latency", description="per link, e.g. '1us'")


def _one_node(keys: NodeKeys, shape: Shape) -> None:
    if shape.nodes != 1:
        raise FitError("nodes", f"{shape.nodes}: topology kind 'dgx' is one node; use kind 'fattree' to join several")


def _node_count(text: str) -> dict:
    """A spec's size part: the node count, which for a lone DGX node is 1."""
    if text != "1":
        raise ValueError("a lone node: 1; fattree:nodes=N joins N nodes")
    return {"nodes": 1}


DGX = TopologyKind(
    name="dgx",
    keys=NodeKeys,
    build=lambda keys, shape: dgx_node(
        shape.gpus_per_node, keys.nvlink_bandwidth_Bps, keys.nic_bandwidth_Bps, keys.link_latency_s
    ),
    routers={SHORTEST_PATH: ShortestPathRouter},
    spec=SpecForm("a node count, e.g. dgx:1", _node_count, {"gpus_per_node": DGX_GPUS, "link_latency": HOP_LATENCY_s}),
    fits=_one_node,
    nvswitch_nodes=True,
)
