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
import numpy as np
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
    if keys.load_balance != "adaptive" or gpus_per_node % blocks.tp:
        return None
    if not blocks.contiguous:
        return _placed_symmetry(keys, shape, blocks)
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
    if blocks.contiguous:
        placement = np.arange(blocks.count * blocks.gpus).reshape(blocks.count, blocks.gpus)
    else:
        placement = np.array(blocks.placement, dtype=np.int64)
        if not _whole_nodes(placement, shape):
            return None
    classes: dict[tuple[int, ...], list[int]] = {}
    for block, pattern in enumerate(_patterns(keys, shape, placement)):
        classes.setdefault(pattern, []).append(block)
    return list(classes.values())


def _placed_symmetry(keys: FatTreeKeys, shape: Shape, blocks: ReplicaBlocks) -> int | None:
    """Blocks laid out otherwise than (dp, pp, tp) (Megatron's own order puts the pipeline
    outermost: a replica is a node, or a part of one, in each stage's share of the machine), on a
    two-tier tree: the fewest blocks whose shift moves whole nodes, rails kept, and full leaf
    groups onto full leaf groups. Walking one block stands for all when that step is 1, or when
    blocks of whole nodes lie on a non-blocking tree alike (`_patterns`; replicas sharing a node
    do not: one's ring neighbour is over NVLink, another's through its NIC); else SHARDS_ONLY
    (shards kept whole inside nodes: tp innermost)."""
    if keys.tiers != 2 or not blocks.placement:
        return None
    placement = np.array(blocks.placement, dtype=np.int64)
    shards = placement.reshape(-1, blocks.tp)
    if (shards != shards[:, :1] + np.arange(blocks.tp)).any() or (shards[:, 0] % blocks.tp).any():
        return None
    alike = (
        keys.oversubscription == 1
        and _whole_nodes(placement, shape)
        and len(set(_patterns(keys, shape, placement))) == 1
    )
    for step in range(1, blocks.count if alike else 2):
        if blocks.count % step == 0 and _moves_the_tree(np.roll(placement, -step, axis=0), placement, keys, shape):
            return step
    return SHARDS_ONLY


def _moves_the_tree(to: np.ndarray, placement: np.ndarray, keys: FatTreeKeys, shape: Shape) -> bool:
    """Whether sending GPU placement[b, i] to to[b, i] is an automorphism of an adaptive two-tier
    tree: each node onto one node, every GPU on its rail, full leaf groups onto full groups."""
    per_node = shape.gpus_per_node
    gpu = np.arange(shape.nodes * per_node)
    image = gpu.copy()
    image[placement.ravel()] = to.ravel()
    node_to = image[::per_node] // per_node
    if (image % per_node != gpu % per_node).any() or (image // per_node != np.repeat(node_to, per_node)).any():
        return False
    group = np.arange(shape.nodes) // keys.leaf_radix
    sizes = np.bincount(group)
    for g, size in enumerate(sizes.tolist()):
        targets = np.unique(node_to[group == g] // keys.leaf_radix)
        if len(targets) != 1 or sizes[targets[0]] != size:
            return False
    return True


def _whole_nodes(placement: np.ndarray, shape: Shape) -> bool:
    """Whether every node's GPUs belong to one block."""
    owner = np.empty(shape.nodes * shape.gpus_per_node, dtype=np.int64)
    owner[placement] = np.arange(len(placement))[:, None]
    return bool((owner.reshape(shape.nodes, -1) == owner[:: shape.gpus_per_node, None]).all())


def _patterns(keys: FatTreeKeys, shape: Shape, placement: np.ndarray) -> list[tuple[int, ...]]:
    """Each block's nodes (in its GPUs' order, each once) as leaf groups counted from its first
    node's: blocks of one pattern have their own messages on paths of the same lengths."""
    patterns = []
    for gpus in placement:
        nodes = list(dict.fromkeys((gpus // shape.gpus_per_node).tolist()))
        patterns.append(tuple(n // keys.leaf_radix - nodes[0] // keys.leaf_radix for n in nodes))
    return patterns


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
