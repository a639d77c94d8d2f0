"""The rail-optimised fat tree joining DGX-style nodes (topologies.dgx), and its ECMP routing.

The fat tree (rail-optimised, as in NVIDIA's DGX SuperPOD): NIC g links to the leaf of rail r in
its group, group = n // leaf_radix, so a leaf has D = min(leaf_radix, nodes) downlinks and each
rail has L = ceil(nodes / leaf_radix) leaves. Each leaf has S = ceil(D / oversubscription) uplinks
of D x nic_bandwidth / (oversubscription x S) each (= nic_bandwidth when oversubscription divides D):
uplink capacity = downlink capacity / oversubscription, full bisection at oversubscription 1.

    tiers = 2:  every leaf links to every one of the S spines ("spine", 0, j).
    tiers = 3:  a group is a pod; leaf (r, p) links to the pod's S spines ("spine", p, j); spine j
                of every pod links to the G cores ("core", j, c) of plane j (G = gpus_per_node),
                each link as fast as a leaf uplink, so spines are non-blocking and only the leaf is
                oversubscribed.

Load balance over the spines (`load_balance`):
    "ecmp"      each flow hashes onto one spine (and core): per-flow ECMP as deployed with static
                hashing; hash collisions leave some uplinks hotter than others.
    "adaptive"  ideal per-packet spraying / adaptive routing (InfiniBand AR, Spectrum-X): every
                flow spreads evenly over all S spines (and all G cores of a plane), which is the
                same as one logical spine per group whose link from each leaf carries the S
                uplinks' total capacity (and one logical core whose link from each spine carries
                the G links' total). Built that way, so a flow stays one flow.

Paths (routing = "ecmp", EcmpRouter below): same node: GPU -> NVSwitch -> GPU.
Otherwise GPU -> NIC -> leaf -> [same leaf: straight down] else spine j [-> core (j, c) -> spine j
of the destination pod] -> destination leaf -> NIC -> GPU; j and c come from a hash of (src, dst).

Its scenario keys and symmetry: topologies.fattree_kind.
"""

from __future__ import annotations

import math

import networkx as nx
import numpy as np

from clustersim.topologies.dgx import (
    DGX_GPUS,
    GPUS_PER_NODE,
    NODES,
    CX7_BANDWIDTH_Bps,
    HOP_LATENCY_s,
    NVLINK4_BANDWIDTH_Bps,
    _add_dgx,
    check_int,
    check_positive,
    dgx_node,
    gpu_id,
    nic_id,
    nvswitch_id,
)
from clustersim.topologies.routing import check_pairs, csr, flow_hash, link_index
from clustersim.topologies.schema import KIND, ROUTING, TOPOLOGY, add_duplex_link

__all__ = ["CX7_BANDWIDTH_Bps", "NVLINK4_BANDWIDTH_Bps", "dgx_node", "fat_tree", "EcmpRouter"]

LEAF_RADIX = 32
LOAD_BALANCE = ("ecmp", "adaptive")
ECMP = "ecmp"

# graph.graph keys the ECMP router reads (besides TOPOLOGY, ROUTING, NODES and GPUS_PER_NODE)
TIERS, LEAVES_PER_RAIL, SPINES = "tiers", "leaves_per_rail", "spines"  # L, and S per group (2 tiers: in total)
CORES = "cores"  # G, cores per plane (three tiers)


def leaf_id(rail: int, group: int) -> tuple:
    return ("leaf", rail, group)


def spine_id(group: int, j: int) -> tuple:
    return ("spine", group, j)


def core_id(j: int, c: int) -> tuple:
    return ("core", j, c)


def fat_tree(
    nodes: int,
    gpus_per_node: int = DGX_GPUS,
    nvlink_bandwidth_Bps: float = NVLINK4_BANDWIDTH_Bps,
    nic_bandwidth_Bps: float = CX7_BANDWIDTH_Bps,
    leaf_radix: int = LEAF_RADIX,
    oversubscription: float = 1.0,
    tiers: int = 2,
    latency_s: float = HOP_LATENCY_s,
    load_balance: str = "ecmp",
) -> nx.DiGraph:
    """`nodes` DGX-style nodes on a rail-optimised fat tree (see the module docstring)."""
    check_int(nodes=nodes, gpus_per_node=gpus_per_node, leaf_radix=leaf_radix)
    check_positive(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        leaf_radix=leaf_radix,
        oversubscription=oversubscription,
        nvlink_bandwidth_Bps=nvlink_bandwidth_Bps,
        nic_bandwidth_Bps=nic_bandwidth_Bps,
    )
    if tiers not in (2, 3):
        raise ValueError(f"tiers must be 2 or 3, got {tiers}")
    if load_balance not in LOAD_BALANCE:
        raise ValueError(f"load_balance must be one of {', '.join(LOAD_BALANCE)}, got {load_balance!r}")
    rails = gpus_per_node
    downlinks = min(leaf_radix, nodes)  # D
    leaves_per_rail = math.ceil(nodes / leaf_radix)  # L (= pods when tiers = 3)
    spines = math.ceil(downlinks / oversubscription)  # S
    uplink_Bps = downlinks * nic_bandwidth_Bps / (oversubscription * spines)
    cores, core_Bps = rails, uplink_Bps  # G per plane (three tiers), and each spine-core link's
    if load_balance == "adaptive":  # the S spines as one, its links carrying the S uplinks' capacity
        uplink_Bps, spines = uplink_Bps * spines, 1
        cores, core_Bps = 1, uplink_Bps * rails  # and the G cores of the plane as one
    graph: nx.DiGraph = nx.DiGraph()
    graph.graph.update(
        {
            TOPOLOGY: "fattree",
            ROUTING: ECMP,
            NODES: nodes,
            GPUS_PER_NODE: gpus_per_node,
            TIERS: tiers,
            LEAVES_PER_RAIL: leaves_per_rail,
            SPINES: spines,
            CORES: cores,
            "leaf_radix": leaf_radix,
            "oversubscription": oversubscription,
            "load_balance": load_balance,
        }
    )
    for n in range(nodes):
        _add_dgx(graph, n, gpus_per_node, nvlink_bandwidth_Bps, nic_bandwidth_Bps, latency_s)
    for group in range(leaves_per_rail):
        for r in range(rails):
            graph.add_node(leaf_id(r, group), **{KIND: "leaf"})
    for n in range(nodes):
        for r in range(rails):
            add_duplex_link(graph, nic_id(n * rails + r), leaf_id(r, n // leaf_radix), nic_bandwidth_Bps, latency_s)
    spine_groups = leaves_per_rail if tiers == 3 else 1
    for group in range(spine_groups):
        for j in range(spines):
            graph.add_node(spine_id(group, j), **{KIND: "spine"})
    for group in range(leaves_per_rail):
        for r in range(rails):
            for j in range(spines):
                add_duplex_link(
                    graph, leaf_id(r, group), spine_id(group if tiers == 3 else 0, j), uplink_Bps, latency_s
                )
    if tiers == 3:
        for j in range(spines):
            for c in range(cores):
                graph.add_node(core_id(j, c), **{KIND: "core"})
                for pod in range(leaves_per_rail):
                    add_duplex_link(graph, spine_id(pod, j), core_id(j, c), core_Bps, latency_s)
    return graph


class EcmpRouter:
    """Equal-cost multipath on topologies.fattree's rail-optimised fat tree.

    h = flow_hash(src, dst); spine j = h mod S; in three tiers core c = (h div S) mod G (G cores per
    plane; adaptive load balance builds S = G = 1: every flow takes the one logical spine and core).
    Paths (links): same node 2 (GPU, NVSwitch, GPU); same leaf 4 (GPU, NIC, leaf, NIC, GPU); via a
    spine 6; via a core (three tiers, different pods) 8. Each is a fewest-hop path.
    """

    def __init__(self, graph: nx.DiGraph):
        g = graph.graph
        nodes, per, self.tiers = g[NODES], g[GPUS_PER_NODE], g[TIERS]
        self.spines, radix, groups = g[SPINES], g["leaf_radix"], g[LEAVES_PER_RAIL]
        self.cores = g[CORES]
        self.num_gpus, self.per_node = nodes * per, per
        ids = link_index(graph)
        gpu = np.arange(self.num_gpus)
        self.node, rail = gpu // per, gpu % per
        self.group = self.node // radix
        self.leaf = rail * groups + self.group  # leaf number (rail, group) -> r * L + group

        def table(pairs) -> np.ndarray:
            return np.array([ids[p] for p in pairs], dtype=np.int64)

        nv, nic = [nvswitch_id(int(n)) for n in self.node], [nic_id(int(x)) for x in gpu]
        gp, lf = [gpu_id(int(x)) for x in gpu], [leaf_id(int(r), int(q)) for r, q in zip(rail, self.group)]
        self.gpu_nv, self.nv_gpu = table(zip(gp, nv)), table(zip(nv, gp))
        self.gpu_nic, self.nic_gpu = table(zip(gp, nic)), table(zip(nic, gp))
        self.nic_leaf, self.leaf_nic = table(zip(nic, lf)), table(zip(lf, nic))
        leaves = [(r, q) for r in range(per) for q in range(groups)]  # in leaf-number order
        top = [[spine_id(q if self.tiers == 3 else 0, j) for j in range(self.spines)] for _, q in leaves]
        self.leaf_up = np.array([table((leaf_id(r, q), s) for s in row) for (r, q), row in zip(leaves, top)])
        self.leaf_down = np.array([table((s, leaf_id(r, q)) for s in row) for (r, q), row in zip(leaves, top)])
        if self.tiers == 3:  # (pod, j, c)
            self.spine_up = np.array(
                [
                    [table((spine_id(q, j), core_id(j, c)) for c in range(self.cores)) for j in range(self.spines)]
                    for q in range(groups)
                ]
            )
            self.spine_down = np.array(
                [
                    [table((core_id(j, c), spine_id(q, j)) for c in range(self.cores)) for j in range(self.spines)]
                    for q in range(groups)
                ]
            )

    def route_many(self, src, dst) -> tuple[np.ndarray, np.ndarray]:
        src, dst = check_pairs(src, dst, self.num_gpus)
        h = flow_hash(src, dst, self.num_gpus)
        spine = (h % np.uint64(self.spines)).astype(np.int64)
        core = (h // np.uint64(self.spines) % np.uint64(self.cores)).astype(np.int64)
        same_node = self.node[src] == self.node[dst]
        same_leaf = ~same_node & (self.leaf[src] == self.leaf[dst])
        cross_pod = (self.group[src] != self.group[dst]) if self.tiers == 3 else np.zeros(src.size, bool)
        length = np.select([src == dst, same_node, same_leaf, cross_pod], [0, 2, 4, 8], default=6)
        indptr, links = csr(length)
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
