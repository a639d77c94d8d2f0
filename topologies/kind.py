"""What a topology kind declares, in one place, so that adding a kind is one module and one registry line.

    KIND = TopologyKind(
        name="ring",
        keys=RingKeys,                    # its scenario keys: a pydantic model (YAML keys are aliases)
        build=lambda keys, shape: ...,    # -> networkx.DiGraph following topologies.schema
        routers={"dimension_order": DimensionOrderRouter},   # graph.graph["routing"] -> router
        spec=SpecForm("a GPU count, e.g. ring:8", ...),     # how `ring:8` reads
    )

The keys model feeds the scenario's validation, its JSON schema and the CLI flags of
`clustersim topology|collective` (sim.scenario.topology reads it); the kind never sees YAML text.
Quantities with units are typed `Bandwidth` or `Seconds`: floats in SI (bytes/s, seconds) marked
with a `Quantity`, so the scenario layer knows to parse "450GB/s" or "1us" before validating.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import networkx as nx
from pydantic import BaseModel, ConfigDict

from clustersim.topologies.routing import Router


@dataclass(frozen=True)
class Quantity:
    """Marks a float field written with a unit: "bandwidth" (bytes/s, > 0) or "seconds" (>= 0)."""

    unit: str


Bandwidth = Annotated[float, Quantity("bandwidth")]
Seconds = Annotated[float, Quantity("seconds")]


class Keys(BaseModel):
    """Base of every kind's keys: unknown keys are errors, values are frozen, types strict."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# The most GPUs a fabric may have: above the largest clusters built (about 100,000 GPUs), and a
# graph of that size already takes gigabytes; beyond it a build would exhaust memory or hang.
MAX_GPUS = 2**17


@dataclass(frozen=True)
class Shape:
    """The cluster a topology joins: `nodes` x `gpus_per_node` GPUs (cluster.nodes, .gpus_per_node)."""

    nodes: int
    gpus_per_node: int

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class ReplicaBlocks:
    """How a run's data-parallel replicas lie on the GPUs, for a kind's `symmetry`: `count` blocks
    of `gpus` GPUs, one block per shift of ep replicas (gpus = ep x pp x tp), tensor-parallel
    shards of `tp` GPUs innermost. `contiguous`: rank order (dp, pp, tp), so block b is GPUs
    b x gpus .. (b + 1) x gpus - 1 and shifting blocks shifts GPU indices. Otherwise `placement`
    lists each block's GPUs (replica, stage, shard order), where the kind may read them."""

    gpus: int
    count: int
    tp: int
    contiguous: bool
    placement: tuple[tuple[int, ...], ...] = ()


SHARDS_ONLY = 0
"""What a kind's `symmetry` answers when no shift of replica blocks is safe (the blocks lie
differently on the fabric: they straddle switch groups) but turning the tensor-parallel shards of
every node alike is an automorphism: the simulator then walks every replica, one shard each."""


class FitError(ValueError):
    """The keys do not fit the cluster; `key` is the path under `cluster` to blame ("topology.axes", "nodes")."""

    def __init__(self, key: str, reason: str):
        super().__init__(reason)
        self.key = key


@dataclass(frozen=True)
class SpecForm:
    """How a one-line spec (`kind[:size][,key=value...]`) reads for this kind. `size` says what the
    positional part is (None: the kind has none); `parse_size` turns it into keys (YAML names, or
    `nodes` / `gpus_per_node`); `defaults` fill what a spec leaves out (the scenario has no defaults
    for them, a spec is for quick what-ifs)."""

    size: str | None = None
    parse_size: Callable[[str], dict[str, Any]] | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)


def no_fit_check(keys: Any, shape: Shape) -> None:
    """Any cluster shape will do."""


def gpus_from_cluster(keys: Any) -> int | None:
    """The keys say nothing about the GPU count: the cluster's nodes x gpus_per_node decide it."""
    return None


@dataclass(frozen=True)
class TopologyKind:
    """One topology kind. `build(keys, shape)` returns the graph; `routers` the routing names its
    graphs may carry in graph.graph["routing"]; `fits(keys, shape)` raises FitError when the keys
    do not fit the cluster; `gpus(keys)` the GPU count the keys fix (torus axes), or None;
    `symmetry(keys, shape, blocks)` the smallest number of replica blocks whose shift (blocks
    wrapping round) maps the fabric and its routes onto themselves (blocks.count: only the
    identity, yet every block lies on the fabric alike), SHARDS_ONLY when only the shard shifts
    do, or None when no shift does; a kind without the attribute has no symmetry the simulator
    may use. `classes(keys, shape, blocks)`, where only shard shifts are automorphisms: the
    blocks that lie on the fabric alike and that nothing shared can slow unequally, as classes
    of block indices (sim.scale.symmetry), or None."""

    name: str
    keys: type[Keys]
    build: Callable[[Any, Shape], nx.DiGraph]
    routers: Mapping[str, Callable[[nx.DiGraph], Router]]
    spec: SpecForm = SpecForm()
    fits: Callable[[Any, Shape], None] = no_fit_check
    gpus: Callable[[Any], int | None] = gpus_from_cluster
    symmetry: Callable[[Any, Shape, ReplicaBlocks], int | None] | None = None
    classes: Callable[[Any, Shape, ReplicaBlocks], list[list[int]] | None] | None = None
    nvswitch_nodes: bool = False  # nodes of GPUs on an NVSwitch, the systems NCCL's layer models (cluster.nccl)
