"""What the collectives need to know about a topology graph: its kind, torus shape, node structure.

Read from the graph's own attributes (`graph.graph`, see topologies.schema), set by the builders:
- TOPOLOGY, the kind's name (topologies.registry; absent on a plain switch: a flat fabric);
- AXES, WRAP: the torus or mesh shape, GPU index = numpy.ravel_multi_index(coords, axes);
- GPUS_PER_NODE (dgx, fat tree): GPU index = node x gpus_per_node + local index (its rail);
- NCCL (sim.collectives.nccl): the NCCL layer's settings, when it is on (set it before the
  graph's first collective: the facts are read once per graph).
A graph without these is one flat fabric: no torus shape, no nodes, textbook algorithms.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import networkx as nx

from clustersim.sim.collectives.nccl import NCCL, NcclConfig
from clustersim.topologies.dgx import GPUS_PER_NODE
from clustersim.topologies.schema import AXES, BANDWIDTH, KIND, TOPOLOGY, WRAP, gpu_nodes


@dataclass(frozen=True)
class Fabric:
    kind: str | None  # graph.graph[TOPOLOGY], None for a plain switch
    num_gpus: int | None  # None: unknown (no graph given), groups not range-checked
    dims: tuple[int, ...] | None  # torus axes (wrapping ones only; a mesh's lines do not close)
    node_of_gpu: tuple[int, ...] | None  # node number of each GPU, None when flat
    nccl: NcclConfig | None = None  # the NCCL layer's settings when it is on
    nic_Bps: float | None = None  # a GPU's NIC rate (GPU -> NIC link), None without NICs


FLAT = Fabric(kind=None, num_gpus=None, dims=None, node_of_gpu=None)


_DESCRIBED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # graph -> Fabric; a run asks per collective


def describe(graph: nx.DiGraph | None) -> Fabric:
    """The facts about `graph` the collectives use (FLAT when there is no graph), worked out once
    per graph (graphs are not changed after they are built)."""
    if graph is None:
        return FLAT
    if graph not in _DESCRIBED:
        _DESCRIBED[graph] = _describe(graph)
    return _DESCRIBED[graph]


def _describe(graph: nx.DiGraph) -> Fabric:
    attrs = graph.graph
    num_gpus = len(gpu_nodes(graph))
    axes = attrs.get(AXES)
    dims = tuple(int(k) for k in axes) if axes is not None and attrs.get(WRAP, True) else None
    if dims is not None and math.prod(dims) != num_gpus:
        dims = None
    per_node = attrs.get(GPUS_PER_NODE)
    node_of_gpu = tuple(i // int(per_node) for i in range(num_gpus)) if per_node else None
    return Fabric(
        kind=attrs.get(TOPOLOGY),
        num_gpus=num_gpus,
        dims=dims,
        node_of_gpu=node_of_gpu,
        nccl=attrs.get(NCCL),
        nic_Bps=gpu_link_Bps(graph, "nic"),
    )


def gpu_link_Bps(graph: nx.DiGraph, kind: str) -> float | None:
    """The bandwidth of GPU 0's link to a node of `kind` (nvswitch, nic), None when it has none."""
    gpus = gpu_nodes(graph)
    if not gpus:
        return None
    return next(
        (float(d[BANDWIDTH]) for _, v, d in graph.out_edges(gpus[0], data=True) if graph.nodes[v][KIND] == kind), None
    )


def node_groups(fabric: Fabric, group: list[int]) -> tuple[tuple[int, ...], ...] | None:
    """Local ranks of `group` on each node (nodes in order of first appearance), or None when flat."""
    if fabric.node_of_gpu is None:
        return None
    nodes: dict[int, list[int]] = {}
    for rank, gpu in enumerate(group):
        nodes.setdefault(fabric.node_of_gpu[gpu], []).append(rank)
    return tuple(tuple(ranks) for ranks in nodes.values())


def torus_dims(fabric: Fabric, group: list[int]) -> tuple[int, ...] | None:
    """The torus shape when `group` is the whole torus in GPU index order, else None."""
    if fabric.dims is None or list(group) != list(range(math.prod(fabric.dims))):
        return None
    return fabric.dims


def spans_nodes(nodes: tuple[tuple[int, ...], ...] | None) -> bool:
    """Several nodes, several GPUs on each, the same count on each: where hierarchical applies."""
    return nodes is not None and len(nodes) > 1 and len({len(n) for n in nodes}) == 1 and len(nodes[0]) > 1
