"""Topology builders by the name a scenario's `cluster.topology.kind` uses; a miss lists the names."""

from __future__ import annotations

from topologies.switch import switch

TOPOLOGIES = {
    "switch": switch,
}
