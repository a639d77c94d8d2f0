"""What starting a pattern of messages needs besides the time, worked out once per pattern.

A run repeats a few patterns (a pipeline's sends, a ring's steps) hundreds of thousands of times;
sim.network.network keeps each one's Plan by (sources, destinations, bytes): the routes of the
messages that move, the latest latency of those that do not (zero bytes, or to oneself), the bytes
each flow puts on each of its links and whether a link repeats among them, the flows' columns
and, in a symmetric run, the orbit members each flow stands for and how its flows start on free
links as one bundle (sim.network.bundles).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from clustersim.sim.network.bundles import BundledFlows, Template
from clustersim.sim.network.maxmin import row_lengths
from clustersim.sim.network.orbits import Orbits
from clustersim.sim.network.routes import Routes, sub_csr


class Plan(NamedTuple):
    src: np.ndarray  # the messages (one per orbit in a symmetric run)
    dst: np.ndarray
    nbytes: np.ndarray
    latency: np.ndarray  # each one's path latency
    idle: np.ndarray  # those that move no bytes
    idle_s: float | None  # the latest of their latencies (None: every message moves)
    ptr: np.ndarray  # the moving ones' routes, a CSR of flow links
    links: np.ndarray
    distinct: bool  # no link twice in `links`
    per_pair: np.ndarray  # bytes per (flow, flow link) pair
    columns: dict  # the flows' columns (sim.network.flows)
    full_src: np.ndarray | None  # every member of the orbits, in a symmetric run
    full_dst: np.ndarray | None
    bundle: Template | None  # how its flows start on free links


def plan_messages(routes: Routes, orbits: Orbits | None, src, dst, nbytes) -> Plan:
    """The Plan of messages src[i] -> dst[i] of nbytes[i] on `routes`, one flow per orbit of
    messages (sim.network.orbits) when `orbits` is given."""
    if orbits is None:
        routed, full_src, full_dst, extra = src != dst, None, None, {}
        ptr, links, latency = routes.cached(src, dst, lambda s, d: routes.route(s, d, s != d))
    else:
        (picked, src, dst, routed, ptr, links, latency, members, full_src, full_dst) = routes.cached(
            src, dst, lambda s, d: orbits.routes(routes, s, d)
        )
        nbytes = nbytes[picked]
    moving = routed & (nbytes > 0)
    if not moving[routed].all():
        ptr, links = sub_csr(ptr, links, moving[routed])
    per_pair = np.repeat(nbytes[moving], row_lengths(ptr))
    if orbits is not None:  # one flow per orbit, on canonical links, standing for its members
        extra = {"members": [m for m, k in zip(members, moving[routed].tolist()) if k]}
        per_pair = per_pair * orbits.per_link[links]
    columns = dict(nbytes=nbytes[moving], latency=latency[moving], src=src[moving], dst=dst[moving], **extra)
    bundle = None
    if orbits is not None and len(ptr) > 1:
        bundle = BundledFlows.template(orbits.capacity_Bps, ptr, links, columns)
    idle_s = float(latency[~moving].max()) if not moving.all() else None
    distinct = len(np.unique(links)) == len(links)
    return Plan(
        src, dst, nbytes, latency, ~moving, idle_s, ptr, links, distinct, per_pair, columns, full_src, full_dst, bundle
    )
