"""Point-to-point messages (pipeline sends) as NCCL moves them when the NCCL layer is on: at
NCCL's NVLink and NIC rates for its send/recv protocol, and, with PXN, an inter-node message
whose destination is on another rail crosses NVLink to the sender-node GPU on that rail and
leaves through its NIC (src/graph/paths.cc; both hops go out together, chunk by chunk).

GPU g of a DGX-like fabric is node g // G, rail g % G (sim.collectives.fabric). Without the
layer the message is the one flow it always was."""

from __future__ import annotations

import functools

import networkx as nx
import numpy as np

from clustersim.sim.collectives import nccl
from clustersim.sim.collectives.fabric import describe
from clustersim.topologies.dgx import GPUS_PER_NODE


def wire(graph: nx.DiGraph, src, dst, nbytes: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(sources, destinations, bytes) of the flows that carry messages src[i] -> dst[i] of
    `nbytes` each, or None when the graph has no NCCL layer (the messages move as they are)."""
    fabric = describe(graph)
    per_node = graph.graph.get(GPUS_PER_NODE)
    if fabric.nccl is None or not per_node or fabric.num_gpus is None:
        return None
    tuned = _tuned(fabric.nccl, fabric.num_gpus, per_node, fabric.nic_Bps, nbytes)
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    same = src // per_node == dst // per_node
    via = src // per_node * per_node + dst % per_node  # the sender-node GPU on the destination's rail
    relay = ~same & (via != src) if tuned.pxn else np.zeros(len(src), bool)
    inter = ~same & ~relay
    parts = [
        (src[same], dst[same], tuned.intra_factor),
        (src[relay], via[relay], tuned.intra_factor),
        (via[relay], dst[relay], tuned.inter_factor),
        (src[inter], dst[inter], tuned.inter_factor),
    ]
    return (
        np.concatenate([p[0] for p in parts]),
        np.concatenate([p[1] for p in parts]),
        np.concatenate([np.full(len(p[0]), nbytes * p[2]) for p in parts]),
    )


@functools.cache
def _tuned(config: nccl.NcclConfig, num_gpus: int, per_node: int, nic_Bps: float, nbytes: float):
    """NCCL's protocol and rates for one message size on this fabric, worked out once (a pipeline
    sends the same few sizes hundreds of thousands of times)."""
    nodes = num_gpus // per_node
    shape = nccl.shape_of(config, nodes, num_gpus, nic_Bps, per_node if nic_Bps else 0)
    return nccl.p2p(config, shape, nbytes, nic_Bps)
