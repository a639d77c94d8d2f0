"""Flow-level network: every message is a flow on a routed path; links are shared max-min fairly.

Whenever a flow starts or finishes, the rates of all active flows are re-shared by progressive
filling (`max_min_rates`), so no link carries more than its bandwidth. A message of M bytes on a
path with latencies l_i is delivered at (time its last byte leaves, given the rates it got) +
sum(l_i): latency is paid once per message, not per byte.

The network lives inside SimPy's event loop: a flow whose rate changes schedules a timeout for
its new finish time, tagged with a version number that the next change bumps, so stale timeouts
are ignored. There is no second event queue.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import simpy

from sim.records import FlowSpan
from topologies.routing import shortest_path_route
from topologies.schema import BANDWIDTH, LATENCY, gpu_nodes


def max_min_rates(flow_of_pair: np.ndarray, link_of_pair: np.ndarray, num_flows: int,
                  capacity_Bps: np.ndarray) -> np.ndarray:
    """Max-min fair rates by progressive filling, vectorised over (flow, link) incidence pairs.

    Each round finds the bottleneck share min_l (residual_l / unfrozen flows on l), gives that rate
    to every unfrozen flow crossing a link at that share, and removes their rate from the links
    they cross. Every flow ends with a saturated link on its path where no flow gets more.
    """
    rates = np.zeros(num_flows)
    residual = capacity_Bps.astype(float)
    frozen = np.zeros(num_flows, dtype=bool)
    active_pair = np.ones(len(flow_of_pair), dtype=bool)
    num_links = len(capacity_Bps)
    while active_pair.any():
        counts = np.bincount(link_of_pair[active_pair], minlength=num_links)
        used = counts > 0
        share = np.full(num_links, np.inf)
        share[used] = residual[used] / counts[used]
        best = share.min()
        bottleneck = used & (share <= best * (1 + 1e-12))
        newly = np.unique(flow_of_pair[active_pair & bottleneck[link_of_pair]])
        newly = newly[~frozen[newly]]
        rates[newly] = best
        frozen[newly] = True
        leaving = active_pair & frozen[flow_of_pair]
        residual -= np.bincount(link_of_pair[leaving], minlength=num_links) * best
        np.maximum(residual, 0.0, out=residual)
        active_pair &= ~leaving
    return rates


SMALL_COMPONENT = 8  # up to this many flows, plain Python beats numpy's per-call overhead


def max_min_rates_small(flow_links: list[tuple[int, ...]], capacity_Bps) -> list[float]:
    """The same progressive filling as `max_min_rates`, in plain Python, for a few flows.

    Same rounds, same bottleneck tolerance, same order of freezing, so both give the same rates.
    """
    residual: dict[int, float] = {}
    count: dict[int, int] = {}
    for links in flow_links:
        for link in links:
            residual[link] = float(capacity_Bps[link])
            count[link] = count.get(link, 0) + 1
    rates = [0.0] * len(flow_links)
    unfrozen = list(range(len(flow_links)))
    while unfrozen:
        best = min(residual[link] / n for link, n in count.items() if n)
        bottleneck = {link for link, n in count.items() if n and residual[link] / n <= best * (1 + 1e-12)}
        still = []
        for i in unfrozen:
            if bottleneck.isdisjoint(flow_links[i]):
                still.append(i)
                continue
            rates[i] = best
            for link in flow_links[i]:
                residual[link] = max(residual[link] - best, 0.0)
                count[link] -= 1
        unfrozen = still
    return rates


class _Flow:
    """One message in flight. `remaining` bytes are as of `since_s`; it drains at `rate` B/s."""

    __slots__ = ("src", "dst", "links", "latency_s", "nbytes", "label", "start_s", "done", "payload",
                 "remaining", "since_s", "rate", "version")

    def __init__(self, src: int, dst: int, links: tuple[int, ...], latency_s: float, nbytes: float, label: str,
                 now_s: float, done: simpy.Event, payload: object):
        self.src, self.dst, self.links, self.latency_s = src, dst, links, latency_s
        self.nbytes, self.label, self.start_s, self.done, self.payload = nbytes, label, now_s, done, payload
        self.remaining, self.since_s, self.rate, self.version = nbytes, now_s, 0.0, 0


class Network:
    """Moves bytes between GPUs over a topology graph (see topologies.schema).

    Flows couple only through shared links, so a start or finish re-shares just the connected
    component of flows (linked by shared links) around the flow that changed: the max-min
    allocation of the other components is unchanged. A flow alone on its links gets the
    slowest link's bandwidth without any array work.
    """

    def __init__(self, env: simpy.Environment, graph: nx.DiGraph):
        self.env = env
        self.graph = graph
        edges = list(graph.edges(data=True))
        self.link_index = {(u, v): i for i, (u, v, _) in enumerate(edges)}
        self.link_names = tuple(f"{u}->{v}" for u, v, _ in edges)
        self.capacity_Bps = np.array([d[BANDWIDTH] for _, _, d in edges], dtype=float)
        self.latency_s = np.array([d[LATENCY] for _, _, d in edges], dtype=float)
        self._gpu_node = gpu_nodes(graph)
        self._routes: dict[tuple[int, int], tuple[tuple[int, ...], float, float]] = {}
        self._on_link: list[dict[_Flow, None]] = [{} for _ in edges]  # insertion-ordered sets
        self.records: list[FlowSpan] = []

    def route(self, src: int, dst: int) -> tuple[tuple[int, ...], float, float]:
        """(link ids, total latency, slowest link's bandwidth) from GPU src to GPU dst, cached."""
        key = (src, dst)
        if key not in self._routes:
            path = shortest_path_route(self.graph, self._gpu_node[src], self._gpu_node[dst])
            links = tuple(self.link_index[e] for e in path)
            latency = float(sum(self.latency_s[l] for l in links))
            slowest = float(min((self.capacity_Bps[l] for l in links), default=np.inf))
            self._routes[key] = (links, latency, slowest)
        return self._routes[key]

    def transfer(self, src: int, dst: int, nbytes: float, label: str, done: simpy.Event | None = None,
                 payload: object = None) -> simpy.Event:
        """Start a message now; `done` (a new event if not given) succeeds with `payload` when the
        message is delivered at dst."""
        links, latency_s, _ = self.route(src, dst)
        flow = _Flow(src, dst, links, latency_s, nbytes, label, self.env.now, done or self.env.event(), payload)
        if nbytes <= 0 or not links:
            self._deliver(flow)
            return flow.done
        for link in links:
            self._on_link[link][flow] = None
        self._reshare(self._component([flow]))
        return flow.done

    def transfer_many(self, src, dst, nbytes, label: str) -> simpy.Event:
        """Start many messages now (GPU index arrays src, dst and byte counts); the returned event
        fires when the last of them has been delivered."""
        events = [self.transfer(int(s), int(d), float(n), label) for s, d, n in zip(src, dst, nbytes)]
        return self.env.all_of(events)

    def _component(self, seeds: list[_Flow]) -> list[_Flow]:
        """Every active flow reachable from `seeds` through shared links, in a deterministic order."""
        seen = dict.fromkeys(seeds)
        stack = list(seeds)
        while stack:
            for link in stack.pop().links:
                for other in self._on_link[link]:
                    if other not in seen:
                        seen[other] = None
                        stack.append(other)
        return list(seen)

    def _reshare(self, flows: list[_Flow]) -> None:
        """New max-min rates for one component; reschedule the finish of flows whose rate changed."""
        if len(flows) == 1:
            rates = [self.route(flows[0].src, flows[0].dst)[2]]
        elif len(flows) <= SMALL_COMPONENT:
            rates = max_min_rates_small([f.links for f in flows], self.capacity_Bps)
        else:
            flow_of_pair = np.repeat(np.arange(len(flows)), [len(f.links) for f in flows])
            links, link_of_pair = np.unique(np.concatenate([f.links for f in flows]), return_inverse=True)
            rates = max_min_rates(flow_of_pair, link_of_pair, len(flows), self.capacity_Bps[links]).tolist()
        now = self.env.now
        for flow, rate in zip(flows, rates):
            if rate == flow.rate:
                continue
            flow.remaining = max(flow.remaining - flow.rate * (now - flow.since_s), 0.0)
            flow.since_s, flow.rate = now, rate
            flow.version += 1
            self.env.timeout(flow.remaining / rate).callbacks.append(
                lambda _, flow=flow, version=flow.version: self._on_finish(flow, version))

    def _on_finish(self, flow: _Flow, version: int) -> None:
        if version != flow.version:
            return  # its rate changed since this finish was scheduled
        neighbours: dict[_Flow, None] = {}
        for link in flow.links:
            del self._on_link[link][flow]
            neighbours.update(self._on_link[link])
        self._deliver(flow)
        if neighbours:
            self._reshare(self._component(list(neighbours)))

    def _deliver(self, flow: _Flow) -> None:
        """The last byte has left; the message lands one path latency later."""
        def land(_):
            self.records.append(FlowSpan(flow.src, flow.dst, flow.links, flow.start_s, self.env.now,
                                         flow.nbytes, flow.label))
            flow.done.succeed(flow.payload)
        self.env.timeout(flow.latency_s).callbacks.append(land)
