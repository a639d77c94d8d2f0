"""The dragonfly (Kim, Dally, Scott, Abts, "Technology-Driven, Highly-Scalable Dragonfly Topology",
ISCA 2008): groups of routers fully connected inside the group, groups joined all-to-all.

    p = cluster.gpus_per_node          GPUs per router (a "node" is one router's GPUs)
    a = routers_per_group              routers per group, every pair linked (local links)
    h = global_links_per_router        global ports per router
    g = cluster.nodes / a              groups, at most a h + 1 (one global link per pair of groups)

The paper's balanced dragonfly has a = 2p = 2h. Nodes: ("gpu", i) and ("router", G, r); GPU i
hangs off router n = i // p, which is router r = n mod a of group G = n // a. Links, all duplex:
GPU <-> its router (link_bandwidth); router <-> router in a group (link_bandwidth); one global
link per pair of groups (global_bandwidth). Group G's link to group G' leaves from its port
k = (G' - G) mod g - 1, on router k // h; so each router uses at most h global ports. Duplex
links: g a p + g a (a - 1) / 2 + g (g - 1) / 2.

Routing (`routing`, both deterministic):
    minimal   local hop to the router holding the global link to the destination group, the
              global hop, local hop to the destination router: at most 3 router-to-router hops
              (same router 0, same group 1).
    valiant   Valiant's randomised routing, as Kim et al. evaluate it: a pair in different groups
              goes minimally to an intermediate group I, then minimally on to its destination, at
              most 5 router hops. I is drawn per (src, dst) from the g - 2 other groups by a fixed
              hash (topologies.routing.flow_hash), so a scenario gives bit-identical results. A
              pair inside one group, or a dragonfly of fewer than 3 groups, routes minimally.
Minimal routing piles all of two groups' traffic onto their one global link; Valiant spreads it
over g - 2 detours at the price of a second global hop. Minimal is fewest global hops, not always
fewest hops: a two-global-hop detour can be shorter than local + global + local.

Spec: `dragonfly:nodes=16[,gpus_per_node=2][,routers_per_group=4][,routing=valiant]...` (defaults
p = 2, a = 4, h = 2 and 25 GB/s links; a scenario states its own bandwidths and latency).
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import networkx as nx
import numpy as np
from pydantic import Field

from clustersim.topologies.kind import Bandwidth, FitError, Keys, Seconds, Shape, SpecForm, TopologyKind
from clustersim.topologies.routing import check_pairs, flow_hash, link_index
from clustersim.topologies.schema import GPU_INDEX, KIND, ROUTING, TOPOLOGY, add_duplex_link, gpu_nodes

MINIMAL, VALIANT = "minimal", "valiant"
# graph.graph keys the router reads
ROUTERS_PER_GROUP, GPUS_PER_ROUTER, GLOBAL_LINKS_PER_ROUTER, GROUPS = "a", "p", "h", "g"


def router_id(group: int, r: int) -> tuple:
    return ("router", group, r)


def global_router(group: int, other: int, groups: int, h: int) -> int:
    """The router (index in `group`) holding `group`'s global link to `other`."""
    return ((other - group) % groups - 1) // h


def dragonfly(
    groups: int,
    routers_per_group: int,
    gpus_per_router: int,
    global_links_per_router: int,
    link_bandwidth_Bps: float,
    global_bandwidth_Bps: float,
    latency_s: float,
    routing: str = MINIMAL,
) -> nx.DiGraph:
    """g groups of a routers of p GPUs each (see the module docstring)."""
    g, a, p, h = groups, routers_per_group, gpus_per_router, global_links_per_router
    if min(g, a, p, h) < 1:
        raise ValueError(
            f"groups, routers_per_group, gpus_per_router, global_links_per_router must be >= 1: {g, a, p, h}"
        )
    if g > a * h + 1:
        raise ValueError(f"{g} groups need more global ports than a x h = {a} x {h} = {a * h} per group (g <= a h + 1)")
    if routing not in (MINIMAL, VALIANT):
        raise ValueError(f"routing must be {MINIMAL} or {VALIANT}, got {routing!r}")
    graph: nx.DiGraph = nx.DiGraph()
    graph.graph.update({TOPOLOGY: "dragonfly", ROUTING: routing, GROUPS: g})
    graph.graph.update({ROUTERS_PER_GROUP: a, GPUS_PER_ROUTER: p, GLOBAL_LINKS_PER_ROUTER: h})
    for i in range(g * a * p):
        graph.add_node(("gpu", i), **{KIND: "gpu", GPU_INDEX: i})
    for group in range(g):
        for r in range(a):
            graph.add_node(router_id(group, r), **{KIND: "router"})
    for i in range(g * a * p):
        add_duplex_link(graph, ("gpu", i), router_id(*divmod(i // p, a)), link_bandwidth_Bps, latency_s)
    for group in range(g):
        for r in range(a):
            for other in range(r + 1, a):
                add_duplex_link(graph, router_id(group, r), router_id(group, other), link_bandwidth_Bps, latency_s)
    for group in range(g):
        for other in range(group + 1, g):
            here, there = global_router(group, other, g, h), global_router(other, group, g, h)
            add_duplex_link(graph, router_id(group, here), router_id(other, there), global_bandwidth_Bps, latency_s)
    return graph


class DragonflyRouter:
    """Minimal or Valiant routes as CSR link ids (topologies.routing.Router). Each flow's path is a
    fixed row of hops (GPU up, local, global, local[, global, local], GPU down), a hop that stays
    on one router left out; vectorised over flows."""

    def __init__(self, graph: nx.DiGraph, valiant: bool = False):
        attrs = graph.graph
        self.g, self.a, self.p, self.h = (
            attrs[GROUPS],
            attrs[ROUTERS_PER_GROUP],
            attrs[GPUS_PER_ROUTER],
            attrs[GLOBAL_LINKS_PER_ROUTER],
        )
        self.valiant = valiant
        ids, gpus = link_index(graph), gpu_nodes(graph)
        routers = [router_id(group, r) for group in range(self.g) for r in range(self.a)]  # router n = G a + r
        self.up = np.array([ids[(gpu, routers[i // self.p])] for i, gpu in enumerate(gpus)], np.int64)
        self.down = np.array([ids[(routers[i // self.p], gpu)] for i, gpu in enumerate(gpus)], np.int64)
        self.local = np.full((len(routers), len(routers)), -1, np.int64)  # (R, R): -1 off-group and on the diagonal
        self.exit = np.zeros((self.g, self.g), np.int64)  # router n leaving group G for G'
        self.glob = np.full((self.g, self.g), -1, np.int64)  # global link id G -> G'
        for group in range(self.g):
            members = range(group * self.a, (group + 1) * self.a)
            for n in members:
                for m in members:
                    if n != m:
                        self.local[n, m] = ids[(routers[n], routers[m])]
        for group in range(self.g):
            for other in range(self.g):
                if group != other:
                    here = group * self.a + global_router(group, other, self.g, self.h)
                    there = other * self.a + global_router(other, group, self.g, self.h)
                    self.exit[group, other], self.glob[group, other] = here, ids[(routers[here], routers[there])]

    def _leg(self, at: np.ndarray, group: np.ndarray, to: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """Hops from router `at` (in `group`) to group `to` (!= group): local, global; and the router landed on."""
        leave = self.exit[group, to]
        return [self.local[at, leave], self.glob[group, to]], self.exit[to, group]

    def route_many(self, src, dst) -> tuple[np.ndarray, np.ndarray]:
        src, dst = check_pairs(src, dst, self.g * self.a * self.p)
        rs, rd = src // self.p, dst // self.p  # routers
        gs, gd = rs // self.a, rd // self.a  # groups
        apart = gs != gd
        to = gd.copy()  # the first global hop's target group: the destination, or Valiant's detour
        if self.valiant and self.g >= 3:
            k = (flow_hash(src, dst, self.g * self.a * self.p) % np.uint64(self.g - 2)).astype(np.int64)
            k += k >= np.minimum(gs, gd)
            k += k >= np.maximum(gs, gd)  # the k-th group other than gs and gd
            to = np.where(apart, k, gd)
        # Where a leg is not taken its target is any other group (masked out below), so tables index cleanly.
        first, landed = self._leg(rs, gs, np.where(apart, to, (gs + 1) % self.g))
        detour = apart & (to != gd)
        second, landed2 = self._leg(landed, to, np.where(detour, gd, (to + 1) % self.g))
        last = np.where(detour, landed2, np.where(apart, landed, rs))
        columns = [self.up[src], *[np.where(apart, c, -1) for c in first]]
        columns += [np.where(detour, c, -1) for c in second]
        columns += [self.local[last, rd], self.down[dst]]
        hops = np.stack(columns, axis=1)  # (F, 7)
        hops[src == dst] = -1
        keep = hops >= 0
        indptr = np.zeros(src.size + 1, np.int64)
        np.cumsum(keep.sum(axis=1), out=indptr[1:])
        return indptr, hops[keep]


class DragonflyKeys(Keys):
    routers_per_group: int = Field(4, gt=0, description="a: routers per group, all linked to each other (default 4)")
    global_links_per_router: int = Field(
        2, gt=0, description="h: global links per router (default 2); groups <= a h + 1"
    )
    link_bandwidth_Bps: Bandwidth = Field(
        alias="link_bandwidth", description="GPU <-> router and router <-> router in a group, per direction"
    )
    global_bandwidth_Bps: Bandwidth = Field(
        alias="global_bandwidth", description="router <-> router between groups, per direction"
    )
    link_latency_s: Seconds = Field(alias="link_latency", description="per link, e.g. '1us'")
    routing: Literal["minimal", "valiant"] = Field(
        "minimal", description="minimal (<= 3 router hops) or valiant (via a hashed intermediate group, <= 5)"
    )


def _fits(keys: DragonflyKeys, shape: Shape) -> None:
    a, h = keys.routers_per_group, keys.global_links_per_router
    if shape.nodes % a:
        raise FitError(
            "nodes", f"{shape.nodes} routers (one per node) do not fill groups of topology.routers_per_group ({a})"
        )
    if shape.nodes // a > a * h + 1:
        raise FitError(
            "nodes",
            f"{shape.nodes} / {a} = {shape.nodes // a} groups, more than routers_per_group x "
            f"global_links_per_router + 1 = {a * h + 1} (one global link per pair of groups)",
        )


DRAGONFLY = TopologyKind(
    name="dragonfly",
    keys=DragonflyKeys,
    build=lambda keys, shape: dragonfly(
        shape.nodes // keys.routers_per_group,
        keys.routers_per_group,
        shape.gpus_per_node,
        keys.global_links_per_router,
        keys.link_bandwidth_Bps,
        keys.global_bandwidth_Bps,
        keys.link_latency_s,
        keys.routing,
    ),
    routers={MINIMAL: DragonflyRouter, VALIANT: partial(DragonflyRouter, valiant=True)},
    spec=SpecForm(
        defaults={"gpus_per_node": 2, "link_bandwidth": 25e9, "global_bandwidth": 25e9, "link_latency": 1e-6}
    ),
    fits=_fits,
)
