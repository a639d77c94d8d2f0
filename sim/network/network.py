"""Flow-level network: every message is a flow on a routed path; links are shared max-min fairly.

State is held as arrays over the active flows (sim.network.flows), so a re-share of a million
flows is a handful of numpy passes (sim.network.maxmin); a symmetric run's network keeps one flow
per orbit (sim.network.orbits), a handful, as Python objects (sim.network.few_flows). Rates are
re-shared whenever flows start (the flows connected to them through shared links are filled
again) or finish (only the flows at or above the slowest finisher's rate are). A message of M
bytes on a path with latencies l_i is delivered at (the time its last byte leaves, given the
rates it got) + sum(l_i): latency is paid once per message. Routes and their caches are
sim.network.routes'; the record of what was delivered is sim.network.ledger's.

Messages are started in groups (`transfer_many`; `transfer` is a group of one); a group's event
fires when its last message lands. Flows whose finish times lie within a relative 1e-9 of the
earliest finish are finished together, so a symmetric collective's thousands of equal flows cost
one re-share, not thousands.

The network lives inside SimPy's event loop: each re-share schedules one timeout for the next
finish, tagged with a generation number that the next re-share bumps, so stale timeouts are
ignored. There is no second event queue.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, cast

import networkx as nx
import numpy as np
import simpy

from clustersim.sim.network.bundles import BundledFlows
from clustersim.sim.network.flows import ActiveFlows, Flows
from clustersim.sim.network.ledger import Ledger, Recording
from clustersim.sim.network.orbits import Orbits
from clustersim.sim.network.plans import Plan, plan_messages
from clustersim.sim.network.records import FlowTable, LinkStats
from clustersim.sim.network.routes import Routes, kept
from clustersim.topologies.routing import Router, make_router
from clustersim.topologies.schema import BANDWIDTH, LATENCY, gpu_nodes, node_label

FINISH_TOGETHER = 1e-9  # relative window of finish times treated as one batch


class _Group:
    """Messages started together: how many are still moving, when the last one lands so far."""

    __slots__ = ("pending", "land_s", "done", "payload")

    def __init__(self, pending: int, land_s: float, done: simpy.Event, payload: object):
        self.pending, self.land_s, self.done, self.payload = pending, land_s, done, payload


class Network:
    """Moves bytes between GPUs over a topology graph (see topologies.schema).

    With `images` ([shift, GPU] -> GPU, the identity first: sim.scale.symmetry's shifts) every message
    moves together with all its images, and the network solves one flow per orbit (sim.network.orbits):
    a transfer moves each distinct message it is given and its images, once.
    """

    def __init__(
        self, env: simpy.Environment, graph: nx.DiGraph, router: Router | None = None, images: np.ndarray | None = None
    ):
        self.env = env
        self.graph = graph
        edges = list(graph.edges(data=True))
        self.num_links = len(edges)
        self.link_names = tuple(f"{node_label(u)}->{node_label(v)}" for u, v, _ in edges)
        self.capacity_Bps = np.array([d[BANDWIDTH] for _, _, d in edges], dtype=float)
        self.latency_s = np.array([d[LATENCY] for _, _, d in edges], dtype=float)
        self.router = router or make_router(graph)
        self.routes = Routes(self.router, self.latency_s)
        self.orbits = None
        if images is not None:  # GPUs outside the shifted ranks stay where they are
            num_gpus = len(gpu_nodes(graph))
            whole = np.tile(np.arange(num_gpus), (len(images), 1))
            whole[:, : images.shape[1]] = images
            self.orbits = Orbits(whole, self.capacity_Bps)
        self._reset_state()

    def fresh(self, env: simpy.Environment) -> Network:
        """An idle network on the same graph sharing this one's routes and caches (cheap: no
        re-reading of the graph), with no flows and no statistics."""
        twin = copy.copy(self)
        twin.env = env
        if self.orbits is not None:  # the twin moves every flow itself (its routes are cached apart)
            twin.orbits, twin.routes = None, self.routes.fresh()
        twin._reset_state()
        return twin

    def _reset_state(self) -> None:
        # a symmetric run's quotient has a handful of flows in flight: kept as Python objects
        self._flows: Flows = (
            ActiveFlows(self.capacity_Bps) if self.orbits is None else BundledFlows(self.orbits.capacity_Bps)
        )
        self._batch: Any = np.zeros(0, dtype=np.int64)  # flows that finish at the next wake (ids as _flows gives them)
        self._generation = 0
        self._groups: dict[int, _Group] = {}  # groups with messages in flight
        self._plans: dict[tuple[bytes, bytes, bytes], Plan] = {}  # by messages (sim.network.plans)
        self.ledger = Ledger(self.link_names, self.capacity_Bps, self.orbits)
        self.reshares = 0  # re-shares so far (after flows start, after a batch of finishes)
        self.flows_reshared = 0  # sum over re-shares of the flows given new rates (a speed measure)

    # -- starting messages -------------------------------------------------------------------

    def transfer(
        self, src: int, dst: int, nbytes: float, label: str, done: simpy.Event | None = None, payload: object = None
    ) -> simpy.Event:
        """One message; `done` (a new event if not given) succeeds with `payload` when it lands."""
        if nbytes <= 0:
            done = done or self.env.event()
            self.env.timeout(self.signal(src, dst, self.env.now, label)).callbacks.append(_succeed(done, payload))
            return done
        return self._start_group(np.array([src]), np.array([dst]), np.array([float(nbytes)]), label, done, payload)

    def signal(self, src: int, dst: int, start_s: float, label: str) -> float:
        """Record a zero-byte message sent at `start_s` (it takes no bandwidth, so nothing is
        re-shared and it may be sent ahead of SimPy's clock); return its path latency."""
        latency_s = self.routes.path_latency(src, dst)
        self.ledger.signal(src, dst, start_s, start_s + latency_s, label)
        return latency_s

    def transfer_many(self, src, dst, nbytes, label: str) -> simpy.Event:
        """Many messages at once (arrays of GPU indices and byte counts); the event fires when the
        last has landed."""
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        nbytes = np.asarray(nbytes, dtype=float)
        if nbytes.shape != src.shape:  # (a pipeline's messages come with theirs: no view to make)
            nbytes = np.broadcast_to(nbytes, src.shape)
        return self._start_group(src, dst, nbytes, label, None, None)

    def _start_group(self, src, dst, nbytes, label, done, payload) -> simpy.Event:
        """Start the messages as flows (in a symmetric run, one flow per orbit among them)."""
        now = self.env.now
        gid = self.ledger.group(label)
        key = (src.tobytes(), dst.tobytes(), nbytes.tobytes())
        if (plan := self._plans.get(key)) is None:
            plan = kept(self._plans, key, len(src), lambda: plan_messages(self.routes, self.orbits, src, dst, nbytes))
        land_s = now + plan.idle_s if plan.idle_s is not None else now
        if plan.idle_s is not None:  # zero-byte messages still pay the path latency; a message to oneself pays nothing
            self._record_idle(plan, now, gid)
        ptr = plan.ptr
        n = len(ptr) - 1
        group = _Group(n, land_s, done or self.env.event(), payload)
        self._groups[gid] = group
        if n == 0:
            self._land(gid)
            return group.done
        self.ledger.add_bytes(plan.links, plan.per_pair, plan.distinct)
        ids = cast(BundledFlows, self._flows).start(plan.bundle, now, gid) if plan.bundle is not None else None
        if ids is None:
            ids = self._flows.add(ptr, plan.links, start=np.full(n, now), group=np.full(n, gid), **plan.columns)
            self._flows.fill_component(ids, now)
        self.reshares += 1
        self.flows_reshared += self._flows.last_refilled
        self._after_fill()
        return group.done

    def _record_idle(self, plan: Plan, start: float, gid: int) -> None:
        """Record a plan's messages that move no bytes (zero bytes, or to oneself) as delivered,
        sent at `start`; in a symmetric run, every member of those orbits."""
        src, dst, idle, nbytes, end = plan.src, plan.dst, plan.idle, plan.nbytes, start + plan.latency
        if self.orbits is not None:
            size, full_src, full_dst = (
                self.orbits.size,
                cast(np.ndarray, plan.full_src),
                cast(np.ndarray, plan.full_dst),
            )
            src, dst = full_src.reshape(-1, size)[idle].ravel(), full_dst.reshape(-1, size)[idle].ravel()
            nbytes, end, idle = np.repeat(nbytes[idle], size), np.repeat(end[idle], size), np.ones(len(src), bool)
        count = int(idle.sum())
        self.ledger.record(
            src[idle],
            dst[idle],
            np.full(count, start),
            end[idle],
            nbytes[idle],
            gid,
            np.zeros(count + 1, np.int64),
            np.zeros(0, np.int64),
        )

    # -- the fluid model -----------------------------------------------------------------------

    def _after_fill(self) -> None:
        """Record the new loads, then schedule one timeout for the next batch of finishes."""
        self._generation += 1
        flows, now = self._flows, self.env.now
        links = flows.touched
        per_link = self.orbits.per_link[links] if self.orbits is not None else None  # the quotient's, on each link
        self.ledger.loads(now, links, flows.loads(links), flows.counts(links), per_link)
        if not flows.num_alive:
            return
        first, self._batch = flows.next_finish(self.env.now, FINISH_TOGETHER)
        generation = self._generation
        self.env.timeout(first).callbacks.append(lambda _: self._wake(generation))

    def _wake(self, generation: int) -> None:
        if generation != self._generation:
            return  # flows started since; that re-fill scheduled its own wake
        flows, finished = self._flows, self._batch
        landing = self.env.now + flows.take(finished, "latency")
        finished_groups = flows.take(finished, "group")
        weights = np.ones(len(finished), np.int64)  # flows each finished id stands for
        if isinstance(flows, ActiveFlows):
            links, owner = flows.pairs_of(finished)
            ptr = np.zeros(len(finished) + 1, dtype=np.int64)
            np.cumsum(np.bincount(owner, minlength=len(finished)), out=ptr[1:])
            self.ledger.record(
                flows.src[finished],
                flows.dst[finished],
                flows.start[finished],
                landing,
                flows.nbytes[finished],
                finished_groups,
                ptr,
                links,
            )
        else:  # every member of each finished orbit lands with it (a bundle's flows one by one)
            bundled = cast(BundledFlows, flows)
            weights = bundled.weights(finished)
            self.ledger.record_orbits(*bundled.records(finished, landing.tolist(), finished_groups.tolist()))
        flows.finish(finished, self.env.now)
        self.reshares += 1
        self.flows_reshared += flows.last_refilled
        landed: dict[int, list] = {}  # group id -> [flows landed, the last landing]
        for gid, land_s, weight in zip(finished_groups.tolist(), landing.tolist(), weights.tolist()):
            if (entry := landed.get(gid)) is None:
                landed[gid] = [weight, land_s]
            else:
                entry[0] += weight
                entry[1] = max(entry[1], land_s)
        for gid in sorted(landed):
            group = self._groups[gid]
            group.pending -= landed[gid][0]
            group.land_s = max(group.land_s, landed[gid][1])
            if group.pending == 0:
                self._land(gid)
        self._after_fill()

    def _land(self, gid: int) -> None:
        group = self._groups.pop(gid)
        self.env.timeout(group.land_s - self.env.now).callbacks.append(_succeed(group.done, group.payload))

    # -- what it delivered (sim.network.ledger) --------------------------------------------------------

    def flow_table(self) -> FlowTable:
        """Every delivered message, in delivery order (ties: the order they were recorded)."""
        return self.ledger.flow_table()

    def link_stats(self, window_s: float) -> LinkStats:
        """Per-link totals over `window_s` and the hottest links' load timeline."""
        return self.ledger.link_stats(window_s)

    # -- collectives timed once, replayed ------------------------------------------------------

    def recording(self) -> Recording:
        """What this network did so far, to be replayed elsewhere: for a collective run alone on
        a `fresh` network (see sim.scale.shortcut); never itself a replay's host."""
        return self.ledger.recording(self.env.now, self.reshares, self.flows_reshared)

    def replay(self, recording: Recording, start_s: float, label: str) -> None:
        """Add a recording's link statistics, load changes and messages as if it had run from
        `start_s` under `label`. Exact only where nothing else used its links meanwhile."""
        self.ledger.replay(recording, start_s, label)
        self.reshares += recording.reshares
        self.flows_reshared += recording.flows_reshared


def _succeed(event: simpy.Event, value: object) -> Callable[[simpy.Event], None]:
    """A callback that makes `event` succeed with `value`."""

    def callback(_: simpy.Event) -> None:
        event.succeed(value)

    return callback
