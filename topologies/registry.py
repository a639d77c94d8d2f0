"""Topology kinds by the name a scenario's `cluster.topology.kind` and a spec (`ring:8`) use.

A plain dict: adding a kind is its module (topologies.kind says what it declares) and one line
here; a miss lists the valid names (`topology_kind`). ROUTERS gathers every kind's routers, by
the name a graph carries in graph.graph["routing"].
"""

from __future__ import annotations

from clustersim.topologies.dgx import DGX
from clustersim.topologies.dragonfly import DRAGONFLY
from clustersim.topologies.fattree_kind import FATTREE
from clustersim.topologies.kind import TopologyKind
from clustersim.topologies.ring import RING
from clustersim.topologies.switch import SWITCH
from clustersim.topologies.torus import MESH, TORUS

TOPOLOGIES: dict[str, TopologyKind] = {kind.name: kind for kind in (SWITCH, RING, TORUS, MESH, DGX, FATTREE, DRAGONFLY)}

ROUTERS = {name: router for kind in TOPOLOGIES.values() for name, router in kind.routers.items()}


def topology_kind(name: str) -> TopologyKind:
    """The kind called `name`; a KeyError listing the valid names on a miss."""
    if name not in TOPOLOGIES:
        raise KeyError(f"unknown topology kind {name!r} (valid: {', '.join(TOPOLOGIES)})")
    return TOPOLOGIES[name]
