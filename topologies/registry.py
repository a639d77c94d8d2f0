"""Topology builders by the name a scenario's `cluster.topology.kind` uses; a miss lists the names.

Builders take different arguments (sim.run.build_topology maps a scenario onto them):
    switch(num_gpus, bandwidth_Bps, latency_s)      ring(num_gpus, bandwidth_Bps, latency_s)
    torus(axes, bandwidth_Bps, latency_s, wrap)     mesh(axes, bandwidth_Bps, latency_s)
    dgx_node(gpus_per_node, nvlink_bandwidth_Bps, nic_bandwidth_Bps, latency_s)
    fat_tree(nodes, gpus_per_node, nvlink_bandwidth_Bps, nic_bandwidth_Bps, leaf_radix,
             oversubscription, tiers, latency_s)
"""

from __future__ import annotations

from clustersim.topologies.fattree import dgx_node, fat_tree
from clustersim.topologies.ring import ring
from clustersim.topologies.switch import switch
from clustersim.topologies.torus import mesh, torus

TOPOLOGIES = {"switch": switch, "ring": ring, "torus": torus, "mesh": mesh, "dgx": dgx_node, "fattree": fat_tree}
