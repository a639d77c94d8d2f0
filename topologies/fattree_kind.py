"""The fat tree as a topology kind: its scenario keys, its graph, and which replicas look alike on it.

Symmetry (for the simulator's replica shortcut, `_symmetry`): with adaptive load balance, shifting
nodes by whole full leaf groups (pods), or any whole nodes within one group, and turning the rails
of every node alike map the tree and its routes onto themselves. ECMP hashing tells images apart.
Where replicas straddle leaf groups no shift does, but on a non-blocking tree the replicas that
straddle alike still do the same at the same times (`_classes`).
"""

from __future__ import annotations

from typing import Literal

import networkx as nx
from pydantic import Field

from clustersim.topologies.dgx import DGX_GPUS, HOP_LATENCY_s, NodeKeys
from clustersim.topologies.fattree import ECMP, LEAF_RADIX, EcmpRouter, fat_tree
from clustersim.topologies.kind import SHARDS_ONLY, ReplicaBlocks, Shape, SpecForm, TopologyKind


class FatTreeKeys(NodeKeys):
    leaf_radix: int = Field(LEAF_RADIX, gt=0, description="NIC ports per leaf switch (default 32)")
    oversubscription: float = Field(
        1.0, gt=0, description="leaf downlink / uplink capacity (default 1: full bisection)"
    )
    tiers: int = Field(2, ge=2, le=3, description="2 (leaf, spine) or 3 (+ core) (default 2)")
    load_balance: Literal["ecmp", "adaptive"] = Field(
        "ecmp", description="ecmp (per-flow hash onto one spine) or adaptive (ideal spraying) (default ecmp)"
    )


def _build(keys: FatTreeKeys, shape: Shape) -> nx.DiGraph:
    return fat_tree(
        shape.nodes,
        shape.gpus_per_node,
        keys.nvlink_bandwidth_Bps,
        keys.nic_bandwidth_Bps,
        keys.leaf_radix,
        keys.oversubscription,
        keys.tiers,
        keys.link_latency_s,
        keys.load_balance,
    )


def _symmetry(keys: FatTreeKeys, shape: Shape, blocks: ReplicaBlocks) -> int | None:
    """With adaptive load balance, turning the rails of every node alike (shards within a node,
    rank order (dp, pp, tp)) is an automorphism. Replicas may shift when blocks are whole nodes
    nested with leaf groups (pods) one in the other, so every block lies on the tree alike; the
    step is the fewest blocks whose shift moves whole groups (all of them, only the identity, when
    the last group is short). Blocks straddling groups or splitting nodes: SHARDS_ONLY."""
    gpus_per_node, radix = shape.gpus_per_node, keys.leaf_radix
    if keys.load_balance != "adaptive" or not blocks.contiguous or gpus_per_node % blocks.tp:
        return None
    block_nodes = blocks.gpus // gpus_per_node
    if blocks.gpus % gpus_per_node:
        return SHARDS_ONLY
    nodes = blocks.count * block_nodes
    if nodes <= radix:  # one leaf group: any shift of whole nodes
        return 1
    if block_nodes % radix and radix % block_nodes:
        return SHARDS_ONLY
    return max(1, radix // block_nodes) if nodes % radix == 0 else blocks.count


def _classes(keys: FatTreeKeys, shape: Shape, blocks: ReplicaBlocks) -> list[list[int]] | None:
    """Blocks of whole nodes that straddle leaf groups alike (each node's group counted from the
    block's first), so their own messages take paths of the same lengths. Only on a non-blocking
    tree (oversubscription 1, adaptive): every leaf's uplinks carry all its D downlinks can, a
    short last group's too, so no message is slowed by where its block sits, only by the NICs
    and GPUs it shares, which every block of a class meets alike."""
    if _symmetry(keys, shape, blocks) != SHARDS_ONLY or keys.oversubscription != 1 or blocks.gpus % shape.gpus_per_node:
        return None
    block_nodes, radix = blocks.gpus // shape.gpus_per_node, keys.leaf_radix
    classes: dict[tuple[int, ...], list[int]] = {}
    for block in range(blocks.count):
        first = block * block_nodes
        pattern = tuple(n // radix - first // radix for n in range(first, first + block_nodes))
        classes.setdefault(pattern, []).append(block)
    return list(classes.values())


FATTREE = TopologyKind(
    name="fattree",
    keys=FatTreeKeys,
    build=_build,
    routers={ECMP: EcmpRouter},
    spec=SpecForm(defaults={"gpus_per_node": DGX_GPUS, "link_latency": HOP_LATENCY_s}),
    symmetry=_symmetry,
    classes=_classes,
    nvswitch_nodes=True,
)
