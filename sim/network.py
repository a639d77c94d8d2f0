"""Flow-level network: every message is a flow on a routed path; links are shared max-min fairly.

Whenever a flow starts or finishes, the rates of all active flows are re-shared by progressive
filling (`max_min_rates`), so no link carries more than its bandwidth. A message of M bytes on a
path with latencies l_i is delivered at (time its last byte leaves, given the rates it got) +
sum(l_i): latency is paid once per message, not per byte.

The network lives inside SimPy's event loop: after each re-share it schedules one timeout for
the earliest finishing flow, tagged with a generation number; a re-share bumps the generation so
stale timeouts are ignored. There is no second event queue.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass
class _Flow:
    src: int
    dst: int
    links: np.ndarray
    latency_s: float
    nbytes: float
    label: str
    start_s: float
    done: simpy.Event
    remaining: float
    rate: float = 0.0


class Network:
    """Moves bytes between GPUs over a topology graph (see topologies.schema)."""

    def __init__(self, env: simpy.Environment, graph: nx.DiGraph):
        self.env = env
        self.graph = graph
        edges = list(graph.edges(data=True))
        self.link_index = {(u, v): i for i, (u, v, _) in enumerate(edges)}
        self.link_names = tuple(f"{u}->{v}" for u, v, _ in edges)
        self.capacity_Bps = np.array([d[BANDWIDTH] for _, _, d in edges], dtype=float)
        self.latency_s = np.array([d[LATENCY] for _, _, d in edges], dtype=float)
        self._gpu_node = gpu_nodes(graph)
        self._routes: dict[tuple[int, int], tuple[np.ndarray, float]] = {}
        self._flows: list[_Flow] = []
        self._last_s = 0.0
        self._generation = 0
        self.records: list[FlowSpan] = []

    def route(self, src: int, dst: int) -> tuple[np.ndarray, float]:
        """Link ids from GPU src to GPU dst and the path's total latency (cached)."""
        key = (src, dst)
        if key not in self._routes:
            path = shortest_path_route(self.graph, self._gpu_node[src], self._gpu_node[dst])
            links = np.array([self.link_index[e] for e in path], dtype=np.int64)
            self._routes[key] = (links, float(self.latency_s[links].sum()))
        return self._routes[key]

    def transfer(self, src: int, dst: int, nbytes: float, label: str) -> simpy.Event:
        """Start a message now; the returned event fires when it is delivered at dst."""
        links, latency_s = self.route(src, dst)
        done = self.env.event()
        flow = _Flow(src, dst, links, latency_s, nbytes, label, self.env.now, done, nbytes)
        if nbytes <= 0 or len(links) == 0:
            self._deliver(flow)
            return done
        self._advance()
        self._flows.append(flow)
        self._reshare()
        return done

    def _advance(self) -> None:
        """Drain every active flow at its current rate up to now."""
        elapsed = self.env.now - self._last_s
        if elapsed > 0:
            for flow in self._flows:
                flow.remaining -= flow.rate * elapsed
        self._last_s = self.env.now

    def _reshare(self) -> None:
        self._generation += 1
        if not self._flows:
            return
        flow_of_pair = np.concatenate([np.full(len(f.links), i) for i, f in enumerate(self._flows)])
        link_of_pair = np.concatenate([f.links for f in self._flows])
        rates = max_min_rates(flow_of_pair, link_of_pair, len(self._flows), self.capacity_Bps)
        for flow, rate in zip(self._flows, rates):
            flow.rate = float(rate)
        next_s = min(max(f.remaining, 0.0) / f.rate for f in self._flows)
        generation = self._generation
        self.env.timeout(next_s).callbacks.append(lambda _: self._on_wake(generation))

    def _on_wake(self, generation: int) -> None:
        if generation != self._generation:
            return  # a later start or finish already re-shared
        self._advance()
        finished = [f for f in self._flows if f.remaining <= 1e-9 * f.nbytes]
        self._flows = [f for f in self._flows if f.remaining > 1e-9 * f.nbytes]
        for flow in finished:
            self._deliver(flow)
        self._reshare()

    def _deliver(self, flow: _Flow) -> None:
        """The last byte has left; the message lands one path latency later."""
        def land(_):
            self.records.append(FlowSpan(flow.src, flow.dst, tuple(int(x) for x in flow.links), flow.start_s,
                                         self.env.now, flow.nbytes, flow.label))
            flow.done.succeed()
        self.env.timeout(flow.latency_s).callbacks.append(land)
