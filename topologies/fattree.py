"""DGX-style nodes (GPUs on one NVSwitch, one NIC per GPU) and the rail-optimised fat tree joining them.

One node n (G = gpus_per_node GPUs; GPU g = n * G + r has local index r, its "rail"):

    GPU g <-> NVSwitch n   nvlink_bandwidth_Bps   (the node's NVSwitch chips modelled as one crossbar)
    GPU g <-> NIC g        nic_bandwidth_Bps      (PCIe Gen5 x16, ~64 GB/s each way, is faster than
                                                   the NIC, so the NIC's rate is the one that binds)

The fat tree (rail-optimised, as in NVIDIA's DGX SuperPOD): NIC g links to the leaf of rail r in
its group, group = n // leaf_radix, so a leaf has D = min(leaf_radix, nodes) downlinks and each
rail has L = ceil(nodes / leaf_radix) leaves. Each leaf has S = ceil(D / oversubscription) uplinks
of D x nic_bandwidth / (oversubscription x S) each (= nic_bandwidth when oversubscription divides D):
uplink capacity = downlink capacity / oversubscription, full bisection at oversubscription 1.

    tiers = 2:  every leaf links to every one of the S spines ("spine", 0, j).
    tiers = 3:  a group is a pod; leaf (r, p) links to the pod's S spines ("spine", p, j); spine j
                of every pod links to the G cores ("core", j, c) of plane j, each link as fast as a
                leaf uplink, so spines are non-blocking and only the leaf is oversubscribed.

Load balance over the spines (`load_balance`):
    "ecmp"      each flow hashes onto one spine (and core): per-flow ECMP as deployed with static
                hashing; hash collisions leave some uplinks hotter than others.
    "adaptive"  ideal per-packet spraying / adaptive routing (InfiniBand AR, Spectrum-X): every
                flow spreads evenly over all S spines, which is the same as one logical spine per
                group whose link from each leaf carries the S uplinks' total capacity. Built that
                way, so a flow stays one flow.

Paths (routing = "ecmp", topologies.routing.EcmpRouter): same node: GPU -> NVSwitch -> GPU.
Otherwise GPU -> NIC -> leaf -> [same leaf: straight down] else spine j [-> core (j, c) -> spine j
of the destination pod] -> destination leaf -> NIC -> GPU; j and c come from a hash of (src, dst).

Sources for the defaults (DGX H100):
- NVLINK4_BANDWIDTH_Bps: H100 SXM NVLink 4 is 900 GB/s per GPU counting both directions (18 links),
  450 GB/s each way (NVIDIA H100 datasheet; DGX H100 user guide).
- CX7_BANDWIDTH_Bps: DGX H100 has 8 ConnectX-7 NICs, one per GPU, 400 Gb/s NDR each: 400e9 / 8 bits
  per byte = 50 GB/s each way (NVIDIA DGX H100 datasheet).
- LEAF_RADIX: a Quantum-2 QM9700 switch has 64 NDR ports; a non-blocking leaf uses 32 down and
  32 up, which is why a SuperPOD scalable unit is 32 nodes (DGX SuperPOD H100 reference design).
- HOP_LATENCY_s: 1 us per link is an assumption (order of a switch hop plus NIC/PCIe time), not a
  measured figure; scenarios state their own.
"""

from __future__ import annotations

import math

import networkx as nx

from clustersim.topologies.schema import GPU_INDEX, KIND, ROUTING, TOPOLOGY, add_duplex_link

NVLINK4_BANDWIDTH_Bps = 450e9
CX7_BANDWIDTH_Bps = 400e9 / 8
LEAF_RADIX = 32
HOP_LATENCY_s = 1e-6
DGX_GPUS = 8
LOAD_BALANCE = ("ecmp", "adaptive")

# graph.graph keys the ECMP router reads (besides TOPOLOGY and ROUTING); a dgx node sets the first two
NODES, GPUS_PER_NODE, TIERS = "nodes", "gpus_per_node", "tiers"
LEAVES_PER_RAIL, SPINES = "leaves_per_rail", "spines"  # L, and S per group (2 tiers: in total)


def gpu_id(g: int) -> tuple:
    return ("gpu", g)


def nvswitch_id(node: int) -> tuple:
    return ("nvswitch", node)


def nic_id(g: int) -> tuple:
    return ("nic", g)


def leaf_id(rail: int, group: int) -> tuple:
    return ("leaf", rail, group)


def spine_id(group: int, j: int) -> tuple:
    return ("spine", group, j)


def core_id(j: int, c: int) -> tuple:
    return ("core", j, c)


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
    _check_int(gpus_per_node=gpus_per_node)
    _check_positive(
        gpus_per_node=gpus_per_node, nvlink_bandwidth_Bps=nvlink_bandwidth_Bps, nic_bandwidth_Bps=nic_bandwidth_Bps
    )
    graph = nx.DiGraph(**{TOPOLOGY: "dgx", ROUTING: "shortest_path", NODES: 1, GPUS_PER_NODE: gpus_per_node})
    _add_dgx(graph, 0, gpus_per_node, nvlink_bandwidth_Bps, nic_bandwidth_Bps, latency_s)
    return graph


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
    _check_int(nodes=nodes, gpus_per_node=gpus_per_node, leaf_radix=leaf_radix)
    _check_positive(
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
    if load_balance == "adaptive":  # the S spines as one, its links carrying the S uplinks' capacity
        uplink_Bps, spines = uplink_Bps * spines, 1
    graph = nx.DiGraph(
        **{
            TOPOLOGY: "fattree",
            ROUTING: "ecmp",
            NODES: nodes,
            GPUS_PER_NODE: gpus_per_node,
            TIERS: tiers,
            LEAVES_PER_RAIL: leaves_per_rail,
            SPINES: spines,
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
            for c in range(rails):
                graph.add_node(core_id(j, c), **{KIND: "core"})
                for pod in range(leaves_per_rail):
                    add_duplex_link(graph, spine_id(pod, j), core_id(j, c), uplink_Bps, latency_s)
    return graph


def _check_positive(**values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")


def _check_int(**values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, got {value!r}")
