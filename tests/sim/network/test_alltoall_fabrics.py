"""All-to-all on a torus against its bisection bound, and on fat trees against the NIC bound.

Bisection bound of a k1 x k2 x k3 torus, all-to-all of s bytes per ordered pair (N = k1 k2 k3):
cut the torus in half across its longest axis k (even). Each of the N/k rings along that axis
crosses the cut twice (once in the middle, once at the wraparound), so 2N/k links cross it in
each direction, each of bandwidth B. Every one of the N/2 GPUs on one side sends s to each of the
N/2 on the other, so (N/2)^2 s bytes must cross in each direction:

    T >= (N/2)^2 s / (2 N/k x B) = N k s / (8 B)

The upper check (2x the bound) allows for dimension-order routing not spreading load perfectly.
Per-GPU injection bandwidth of a 3D torus is 6B (six links out); the fat tree compared with it
gives each GPU's NIC 6B, so an all-to-all there is NIC-bound: every GPU pushes (N - G) s bytes
to other nodes through its NIC (the G - 1 peers in its own node go over NVLink, faster).
"""

import numpy as np
import pytest
import simpy

from clustersim.sim.network.network import Network
from clustersim.topologies.fattree import fat_tree
from clustersim.topologies.routing import make_router
from clustersim.topologies.torus import torus

B, LAT, S = 100e9, 1e-6, 2**20  # torus link bandwidth, per-hop latency, bytes per ordered pair


def all_to_all_time(graph, pairs=None) -> float:
    n = sum(1 for _, d in graph.nodes(data=True) if d["kind"] == "gpu")
    src, dst = np.divmod(np.arange(n * n), n)
    keep = src != dst if pairs is None else pairs(src, dst)
    network = Network(simpy.Environment(), graph)
    network.transfer_many(src[keep], dst[keep], S, "all_to_all")
    network.env.run()
    return network.env.now


@pytest.mark.parametrize("axes", [(4, 4, 4), (8, 8, 8)])
def test_torus_all_to_all_is_between_the_bisection_bound_and_twice_it(axes):
    n, k = int(np.prod(axes)), max(axes)
    bound = n * k * S / (8 * B)
    t = all_to_all_time(torus(axes, B, LAT))
    assert bound <= t <= 2 * bound, (t, bound, t / bound)


def fabric(load_balance, oversubscription=1.0, nodes=64, leaf_radix=32):
    return fat_tree(
        nodes,
        8,
        nvlink_bandwidth_Bps=450e9,
        nic_bandwidth_Bps=6 * B,
        leaf_radix=leaf_radix,
        oversubscription=oversubscription,
        latency_s=LAT,
        load_balance=load_balance,
    )


def test_full_bisection_fat_tree_all_to_all_is_nic_bound():
    n, g = 512, 8
    nic_bound = (n - g) * S / (6 * B)
    t = all_to_all_time(fabric("adaptive"))
    assert t == pytest.approx(nic_bound, rel=0.05)


def test_ecmp_hash_collisions_make_the_hottest_uplink_the_bound():
    """Static per-flow hashing leaves some spine uplinks with more flows than others, so the
    all-to-all is slower than the NIC bound and set by the most loaded link: bytes routed over it
    (counted here from the router, independently of the network) / its bandwidth, plus the
    6-hop path latency. 16 nodes on 8-port leaves (2 leaves per rail, 8 spines) keep it quick."""
    n, g = 128, 8
    graph = fabric("ecmp", nodes=16, leaf_radix=8)
    src, dst = np.divmod(np.arange(n * n), n)
    _, links = make_router(graph).route_many(src[src != dst], dst[src != dst])
    capacity = np.array([d["bandwidth"] for _, _, d in graph.edges(data=True)])
    hottest = (np.bincount(links, minlength=len(capacity)) * S / capacity).max()
    t = all_to_all_time(graph)
    assert hottest > (n - g) * S / (6 * B) * 1.1  # collisions: the hottest uplink beats the NIC
    assert hottest <= t - 6 * LAT <= hottest * 1.05


def test_oversubscription_2_makes_the_cross_leaf_part_twice_as_slow():
    # nodes 0-31 hang off one leaf per rail, nodes 32-63 off the other: keep only cross-leaf pairs
    def cross_leaf(src, dst):
        return (src // 8) // 32 != (dst // 8) // 32

    full = all_to_all_time(fabric("adaptive", 1.0), cross_leaf)
    half = all_to_all_time(fabric("adaptive", 2.0), cross_leaf)
    assert half / full == pytest.approx(2.0, rel=0.05)
