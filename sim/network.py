"""Flow-level network: every message is a flow on a routed path; links are shared max-min fairly.

State is held as arrays over the active flows (sim.flows), so a re-share of a million flows is a
handful of numpy passes (sim.maxmin). Rates are re-shared whenever flows start (the flows
connected to them through shared links are filled again) or finish (only the flows at or above
the slowest finisher's rate are). A message of M bytes on a path with latencies l_i is delivered at (the time its
last byte leaves, given the rates it got) + sum(l_i): latency is paid once per message.

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
from typing import NamedTuple

import networkx as nx
import numpy as np
import simpy

from sim.few_flows import FewFlows
from sim.flows import ActiveFlows
from sim.maxmin import concat_ranges, row_lengths
from sim.orbits import Orbits
from sim.records import FlowTable, LinkStats
from topologies.routing import Router, make_router
from topologies.schema import BANDWIDTH, LATENCY, gpu_nodes, node_label

FINISH_TOGETHER = 1e-9  # relative window of finish times treated as one batch
PATTERN_CACHE_SIZE = 4096  # (src, dst) patterns whose routes are kept
PATTERN_MAX_MESSAGES = 4096  # larger patterns are routed each time


LISTED_MESSAGES_MAX = 2_000_000  # past this many replayed and orbit messages, those are summed per stream
TIMELINE_LINKS = 16  # the load timeline link_stats gives: of this many hottest links (links_plot.TOP_LINKS)


class Recording(NamedTuple):
    """A network's activity from t = 0, to be replayed: how long it took, the links it used with
    their bytes, busy time and peak flows, its load changes and its messages (as finish records)."""

    duration_s: float
    links: np.ndarray
    bytes: np.ndarray
    busy_s: np.ndarray
    peak_flows: np.ndarray
    timeline: tuple[np.ndarray, np.ndarray, np.ndarray]
    messages: tuple[np.ndarray, ...]
    reshares: int
    flows_reshared: int


class _Group:
    """Messages started together: how many are still moving, when the last one lands so far."""

    __slots__ = ("pending", "land_s", "done", "payload")

    def __init__(self, pending: int, land_s: float, done: simpy.Event, payload: object):
        self.pending, self.land_s, self.done, self.payload = pending, land_s, done, payload


class Network:
    """Moves bytes between GPUs over a topology graph (see topologies.schema).

    With `images` ([shift, GPU] -> GPU, the identity first: sim.symmetry's shifts) every message
    moves together with all its images, and the network solves one flow per orbit (sim.orbits):
    a transfer moves each distinct message it is given and its images, once.
    """

    def __init__(self, env: simpy.Environment, graph: nx.DiGraph, router: Router | None = None,
                 images: np.ndarray | None = None):
        self.env = env
        self.graph = graph
        edges = list(graph.edges(data=True))
        self.num_links = len(edges)
        self.link_names = tuple(f"{node_label(u)}->{node_label(v)}" for u, v, _ in edges)
        self.capacity_Bps = np.array([d[BANDWIDTH] for _, _, d in edges], dtype=float)
        self.latency_s = np.array([d[LATENCY] for _, _, d in edges], dtype=float)
        self.router = router or make_router(graph)
        self._latency_cache: dict[tuple[int, int], float] = {}
        self._pattern_cache: dict[tuple[bytes, bytes], tuple] = {}
        self.orbits = None
        if images is not None:  # GPUs outside the shifted ranks stay where they are
            num_gpus = len(gpu_nodes(graph))
            whole = np.tile(np.arange(num_gpus), (len(images), 1))
            whole[:, :images.shape[1]] = images
            self.orbits = Orbits(whole, self.capacity_Bps)
        self._reset_state()

    def fresh(self, env: simpy.Environment) -> Network:
        """An idle network on the same graph sharing this one's routes and caches (cheap: no
        re-reading of the graph), with no flows and no statistics."""
        twin = copy.copy(self)
        twin.env = env
        if self.orbits is not None:  # the twin moves every flow itself (its routes are cached apart)
            twin.orbits, twin._pattern_cache = None, {}
        twin._reset_state()
        return twin

    def _reset_state(self) -> None:
        # a symmetric run's quotient has a handful of flows in flight: kept as Python objects
        self._flows = ActiveFlows(self.capacity_Bps) if self.orbits is None else FewFlows(self.orbits.capacity_Bps)
        self._member_sets: list[tuple | None] = []  # a quotient flow's messages: (src, dst, route CSR)
        self._batch = np.zeros(0, dtype=np.int64)  # flows that finish at the next wake
        self._generation = 0
        self._groups: dict[int, _Group] = {}  # groups with messages in flight
        self._labels: list[str] = []  # group id -> label
        # statistics: the flows' by flow link (a canonical link stands for its orbit, sim.orbits), the
        # replays' by link; replays only use links no flow uses (sim.shortcut), so the two just add up
        self._flow_bytes = np.zeros(self.num_links)
        self._flow_busy_s = np.zeros(self.num_links)
        self._busy_from = np.full(self.num_links, np.nan)  # since when a link carries flows (NaN: idle)
        self._flow_peak = np.zeros(self.num_links, dtype=np.int64)
        self._replay_bytes = np.zeros(self.num_links)
        self._replay_busy_s = np.zeros(self.num_links)
        self._replay_peak = np.zeros(self.num_links, dtype=np.int64)
        # chunks of (times, flow links, loads, place): the links whose load changed, the new load, and
        # the chunk's place among the chunks and replays, to keep changes at one instant in their order
        self._timeline: list[tuple[np.ndarray, np.ndarray, np.ndarray, int]] = []
        self._load = np.zeros(self.num_links)  # the load now, by flow link
        self._orbit_records: list[tuple] = []  # delivered orbits: (members, start, end, bytes, group id)
        self._orbit_messages = 0
        self.reshares = 0  # re-shares so far (after flows start, after a batch of finishes)
        self.flows_reshared = 0  # sum over re-shares of the flows given new rates (a speed measure)
        self._done_records: list[tuple] = []  # delivered messages, a batch of arrays per finish
        self._signals: list[tuple[int, int, float, float, str]] = []  # zero-byte messages (src, dst, start, end, label)
        self._replays: list[tuple[Recording, float, int, int]] = []  # (recording, start, group id, place),
        # expanded at the end
        self._replayed_messages = 0

    # -- starting messages -------------------------------------------------------------------

    def transfer(self, src: int, dst: int, nbytes: float, label: str, done: simpy.Event | None = None,
                 payload: object = None) -> simpy.Event:
        """One message; `done` (a new event if not given) succeeds with `payload` when it lands."""
        if nbytes <= 0:
            done = done or self.env.event()
            self.env.timeout(self.signal(src, dst, self.env.now, label)).callbacks.append(
                lambda _: done.succeed(payload))
            return done
        return self._start_group(np.array([src]), np.array([dst]), np.array([float(nbytes)]), label, done, payload)

    def signal(self, src: int, dst: int, start_s: float, label: str) -> float:
        """Record a zero-byte message sent at `start_s` (it takes no bandwidth, so nothing is
        re-shared and it may be sent ahead of SimPy's clock); return its path latency."""
        latency_s = self._latency_cache.get((src, dst))
        if latency_s is None:
            latency_s = self._path_latency(src, dst)
        self._signals.append((src, dst, start_s, start_s + latency_s, label))
        return latency_s

    def _cached(self, src: np.ndarray, dst: np.ndarray, make):
        """make(src, dst), cached by the (src, dst) pattern: a collective repeats the same few
        patterns step after step."""
        if len(src) > PATTERN_MAX_MESSAGES:  # a one-off bulk (an all-to-all): not worth keeping
            return make(src, dst)
        key = (src.tobytes(), dst.tobytes())
        if key not in self._pattern_cache:
            if len(self._pattern_cache) >= PATTERN_CACHE_SIZE:
                self._pattern_cache.clear()
            self._pattern_cache[key] = make(src, dst)
        return self._pattern_cache[key]

    def _orbit_routes(self, src: np.ndarray, dst: np.ndarray):
        """For messages given by a symmetric run, one per orbit among them: (which of them stand
        for their orbits, their src, dst, routed mask, routes on canonical links (CSR, of the
        routed) and latency; each routed orbit's members as (src, dst, route CSR); every member's
        src and dst, orbit-major)."""
        orbits = self.orbits
        picked = np.unique(orbits.keys(src, dst), return_index=True)[1]
        picked.sort()
        full_src, full_dst = orbits.members(src[picked], dst[picked])
        routed = full_src != full_dst
        ptr, links, latency = self._route(full_src, full_dst, routed)
        size = orbits.size
        flow_ptr, flow_links = orbits.learn(ptr, links, int(routed[::size].sum()))
        members = []
        for j in range(len(flow_ptr) - 1):
            rows = ptr[j * size:(j + 1) * size + 1]
            first = np.flatnonzero(routed)[j * size]
            members.append((full_src[first:first + size], full_dst[first:first + size], rows - rows[0],
                            links[rows[0]:rows[-1]]))
        return (picked, src[picked], dst[picked], routed[::size], flow_ptr, flow_links, latency[::size], members,
                full_src, full_dst)

    def _route(self, src: np.ndarray, dst: np.ndarray, routed: np.ndarray):
        ptr, links = (self.router.route_many(src[routed], dst[routed]) if routed.any()
                      else (np.zeros(1, np.int64), np.zeros(0, np.int64)))
        latency = np.zeros(len(src))
        if len(links):
            latency[routed] = np.add.reduceat(self.latency_s[links], ptr[:-1])
        return ptr, links, latency

    def _path_latency(self, src: int, dst: int) -> float:
        """Total latency of the route from GPU src to GPU dst (0 to itself), cached per pair."""
        key = (src, dst)
        if key not in self._latency_cache:
            self._latency_cache[key] = float(self._route(np.array([src]), np.array([dst]), np.array([src != dst]))[2][0])
        return self._latency_cache[key]

    def transfer_many(self, src, dst, nbytes, label: str) -> simpy.Event:
        """Many messages at once (arrays of GPU indices and byte counts); the event fires when the
        last has landed."""
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        nbytes = np.broadcast_to(np.asarray(nbytes, dtype=float), src.shape)
        return self._start_group(src, dst, nbytes, label, None, None)

    def _start_group(self, src, dst, nbytes, label, done, payload) -> simpy.Event:
        """Start the messages as flows (in a symmetric run, one flow per orbit among them)."""
        now = self.env.now
        gid = len(self._labels)
        self._labels.append(label)
        if self.orbits is None:
            routed, full_src, full_dst = src != dst, None, None
            ptr, links, latency = self._cached(src, dst, lambda s, d: self._route(s, d, s != d))
        else:
            (picked, src, dst, routed, ptr, links, latency, members, full_src,
             full_dst) = self._cached(src, dst, self._orbit_routes)
            nbytes = nbytes[picked]
        moving = routed & (nbytes > 0)
        if not moving[routed].all():
            ptr, links = _sub_csr(ptr, links, moving[routed])
        # zero-byte messages still pay the path latency; a message to oneself pays nothing
        idle = ~moving
        land_s = float((now + latency[idle]).max()) if idle.any() else now
        if idle.any():
            self._record_idle(src, dst, idle, nbytes, now, now + latency, gid, full_src, full_dst)
        n = int(moving.sum())
        group = _Group(n, land_s, done or self.env.event(), payload)
        self._groups[gid] = group
        if n == 0:
            self._land(gid)
            return group.done
        extra = {}
        per_pair = np.repeat(nbytes[moving], row_lengths(ptr))
        if self.orbits is not None:  # one flow per orbit, on canonical links, standing for its members
            extra["members"] = np.arange(len(self._member_sets), len(self._member_sets) + n)
            self._member_sets.extend(m for m, k in zip(members, moving[routed].tolist()) if k)
            per_pair *= self.orbits.per_link[links]
        np.add.at(self._flow_bytes, links, per_pair)
        ids = self._flows.add(ptr, links, nbytes=nbytes[moving], latency=latency[moving], start=np.full(n, now),
                              src=src[moving], dst=dst[moving], group=np.full(n, gid), **extra)
        self._flows.fill_component(ids, now)
        self.reshares += 1
        self.flows_reshared += self._flows.last_refilled
        self._after_fill()
        return group.done

    def _record_idle(self, src, dst, idle, nbytes, start, end, gid, full_src, full_dst) -> None:
        """Record messages that move no bytes (zero bytes, or to oneself) as delivered; in a
        symmetric run, every member of those orbits."""
        if self.orbits is not None:
            size = self.orbits.size
            src, dst = full_src.reshape(-1, size)[idle].ravel(), full_dst.reshape(-1, size)[idle].ravel()
            nbytes, end, idle = np.repeat(nbytes[idle], size), np.repeat(end[idle], size), np.ones(len(src), bool)
        count = int(idle.sum())
        self._record(src[idle], dst[idle], np.full(count, start), end[idle], nbytes[idle], gid,
                     np.zeros(count + 1, np.int64), np.zeros(0, np.int64))

    # -- the fluid model -----------------------------------------------------------------------

    def _after_fill(self) -> None:
        """Record the new loads, then schedule one timeout for the next batch of finishes."""
        self._generation += 1
        flows, now = self._flows, self.env.now
        links = flows.touched
        load, count = flows.loads(links), flows.counts(links)
        if self.orbits is not None:  # the quotient's, as on each link of the orbit
            per_link = self.orbits.per_link[links]
            load, count = load * per_link, np.rint(count * per_link).astype(np.int64)
        changed = load != self._load[links]
        self._load[links[changed]] = load[changed]
        self._timeline.append((np.broadcast_to(now, (int(changed.sum()),)), links[changed], load[changed],
                               self._next_place()))
        self._flow_peak[links] = np.maximum(self._flow_peak[links], count)
        idle = np.isnan(self._busy_from[links])
        busy = count > 0
        self._busy_from[links[busy & idle]] = now
        ends = links[~busy & ~idle]
        self._flow_busy_s[ends] += now - self._busy_from[ends]
        self._busy_from[ends] = np.nan
        if not flows.num_alive:
            return
        first, self._batch = flows.next_finish(self.env.now, FINISH_TOGETHER)
        generation = self._generation
        self.env.timeout(first).callbacks.append(lambda _: self._wake(generation))

    def _next_place(self) -> int:
        """The place of the next load-change chunk or replay, in the order they happen."""
        return len(self._timeline) + len(self._replays)

    def _wake(self, generation: int) -> None:
        if generation != self._generation:
            return  # flows started since; that re-fill scheduled its own wake
        flows, finished = self._flows, self._batch
        landing = self.env.now + flows.take(finished, "latency")
        finished_groups = flows.take(finished, "group")
        if self.orbits is None:
            links, owner = flows.pairs_of(finished)
            ptr = np.zeros(len(finished) + 1, dtype=np.int64)
            np.cumsum(np.bincount(owner, minlength=len(finished)), out=ptr[1:])
            self._record(flows.src[finished], flows.dst[finished], flows.start[finished], landing,
                         flows.nbytes[finished], finished_groups, ptr, links)
        else:  # every member of each finished orbit lands with it
            self._record_members(finished, landing, finished_groups)
        flows.finish(finished, self.env.now)
        self.reshares += 1
        self.flows_reshared += flows.last_refilled
        for gid in np.unique(finished_groups).tolist():
            group = self._groups[gid]
            mine = finished_groups == gid
            group.pending -= int(mine.sum())
            group.land_s = max(group.land_s, float(landing[mine].max()))
            if group.pending == 0:
                self._land(gid)
        self._after_fill()

    def _record_members(self, finished, landing: np.ndarray, groups: np.ndarray) -> None:
        """Note the finished orbits (their members are listed, or summed, at the end)."""
        flows, sets = self._flows, self._member_sets
        members = flows.take(finished, "members").tolist()
        self._orbit_records.extend(zip([sets[m] for m in members], flows.take(finished, "start").tolist(),
                                       landing.tolist(), flows.take(finished, "nbytes").tolist(), groups.tolist()))
        for m in members:
            sets[m] = None
        self._orbit_messages += len(members) * self.orbits.size

    def _land(self, gid: int) -> None:
        group = self._groups.pop(gid)
        self.env.timeout(group.land_s - self.env.now).callbacks.append(lambda _: group.done.succeed(group.payload))

    # -- records -------------------------------------------------------------------------------

    def _record(self, src, dst, start, end, nbytes, group, ptr, links) -> None:
        self._done_records.append((src, dst, start, end, nbytes, np.broadcast_to(group, src.shape), ptr, links))

    def _flush_signals(self) -> None:
        """Move the zero-byte signals into the message records: route-less, each its own label."""
        if self._signals:
            src, dst, start, end, labels = zip(*self._signals)
            first = len(self._labels)
            self._labels.extend(labels)
            self._signals.clear()
            self._record(np.array(src), np.array(dst), np.array(start), np.array(end), np.zeros(len(src)),
                         np.arange(first, first + len(src)), np.zeros(len(src) + 1, np.int64), np.zeros(0, np.int64))

    def _listing(self) -> bool:
        """Whether replayed and orbit messages are listed one by one (else summed, see flow_table)."""
        return self._replayed_messages + self._orbit_messages <= LISTED_MESSAGES_MAX

    def _orbit_columns(self) -> list[tuple]:
        """The finished orbits' members as record batches."""
        size = self.orbits.size if self.orbits is not None else 0
        return [(src, dst, np.full(size, start), np.full(size, end), np.full(size, nbytes), np.full(size, gid), ptr, route)
                for (src, dst, ptr, route), start, end, nbytes, gid in self._orbit_records]

    def _messages(self) -> tuple:
        """Every delivered message so far as one batch of columns (src, dst, start, end, bytes,
        group, route CSR), zero-byte signals included, replayed ones too while they are listed."""
        self._flush_signals()
        records = self._done_records
        if self._listing():
            records = records + self._orbit_columns()
        if self._replays and self._listing():
            records = records + [(src, dst, start + at, end + at, nbytes, np.broadcast_to(gid, src.shape), ptr, route)
                                 for (src, dst, start, end, nbytes, ptr, route), at, gid
                                 in ((r.messages, at, gid) for r, at, gid, _ in self._replays)]
        if not records:
            empty = np.zeros(0)
            return empty, empty, empty, empty, empty, np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int64)
        columns = [np.concatenate([np.asarray(r[i]) for r in records]) for i in range(6)]
        lengths = np.concatenate([row_lengths(r[6]) for r in records])
        ptr = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=ptr[1:])
        return (*columns, ptr, np.concatenate([r[7] for r in records]))

    def flow_table(self) -> FlowTable:
        """Every delivered message, in delivery order (ties: the order they were recorded)."""
        src, dst, start, end, nbytes, group, ptr, links = self._messages()
        order = np.argsort(end, kind="stable")
        lengths = row_lengths(ptr)[order]
        new_ptr = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(lengths, out=new_ptr[1:])
        return FlowTable(src[order].astype(np.int64), dst[order].astype(np.int64), start[order].astype(float),
                         end[order].astype(float), nbytes[order].astype(float), group[order].astype(np.int64),
                         tuple(self._labels), new_ptr, links[concat_ranges(ptr[order], ptr[order + 1])],
                         self._summed())

    def _summed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Past LISTED_MESSAGES_MAX, the replayed and orbit messages as (src, dst, bytes, label),
        summed by one stream over the replays of each recording and over the orbits of each
        members' list (labelled by the first one's label)."""
        if self._listing():
            return FlowTable.summed_default()
        sums: dict[tuple[int, str], list] = {}  # (recording or members, stream) -> [src, dst, bytes, first label]
        for r, _, gid, _ in self._replays:
            entry = sums.setdefault((id(r), self._labels[gid].split(":", 1)[0]),
                                    [r.messages[0], r.messages[1], np.zeros(len(r.messages[0])), gid])
            entry[2] += r.messages[4]
        for members, _, _, nbytes, gid in self._orbit_records:
            entry = sums.setdefault((id(members), self._labels[gid].split(":", 1)[0]), [members[0], members[1], 0.0, gid])
            entry[2] += nbytes
        src, dst, nbytes, label = zip(*((s, d, np.broadcast_to(b, s.shape), np.full(len(s), gid))
                                        for s, d, b, gid in sums.values()))
        return (np.concatenate(src).astype(np.int64), np.concatenate(dst).astype(np.int64),
                np.concatenate(nbytes).astype(float), np.concatenate(label).astype(np.int64))

    def _load_timeline(self, links: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every load change in time order, replays included (changes at one instant in the order
        they happened); of `links` only when given. A flow link's changes go to every link of
        its orbit."""
        wanted = np.ones(self.num_links, dtype=bool)
        if links is not None:
            wanted[:] = False
            wanted[links] = True
        chunks = []
        if self._timeline:
            t, l, v = (np.concatenate(column) for column in list(zip(*self._timeline))[:3])
            place = np.repeat([p for *_, p in self._timeline], [len(c) for _, c, _, _ in self._timeline])
            if self.orbits is None:
                keep = wanted[l]
                chunks.append((t[keep], l[keep], v[keep], place[keep]))
            else:  # each change, once per wanted link of its orbit
                real = np.flatnonzero(wanted)
                canon = self.orbits.canon[real]
                by_canon = real[np.argsort(canon, kind="stable")]
                ptr = np.zeros(self.num_links + 1, dtype=np.int64)
                np.cumsum(np.bincount(canon, minlength=self.num_links), out=ptr[1:])
                rows = np.repeat(np.arange(len(l)), ptr[l + 1] - ptr[l])
                chunks.append((t[rows], by_canon[concat_ranges(ptr[l], ptr[l + 1])], v[rows], place[rows]))
        by_recording: dict[int, tuple[Recording, list[float], list[int]]] = {}  # each recording's replays, at once
        for r, at, _, place in self._replays:
            entry = by_recording.setdefault(id(r), (r, [], []))
            entry[1].append(at)
            entry[2].append(place)
        for r, at, place in by_recording.values():
            t, l, v = r.timeline
            keep = wanted[l]
            n, k = len(at), int(keep.sum())
            chunks.append(((np.asarray(at)[:, None] + t[keep][None, :]).ravel(), np.tile(l[keep], n), np.tile(v[keep], n),
                           np.repeat(place, k)))
        if not chunks:
            return np.zeros(0), np.zeros(0, np.int64), np.zeros(0)
        times, ids, loads, order_of = (np.concatenate(column) for column in zip(*chunks))
        order = np.lexsort((order_of, times))  # stable: a chunk keeps its own order
        return times[order], ids[order], loads[order]

    def _link_totals(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bytes, busy seconds, peak flows) per link: the replays' plus the flows' (a flow link's
        for every link of its orbit)."""
        real = (lambda x: x) if self.orbits is None else (lambda x: x[self.orbits.canon])  # noqa: E731
        return (self._replay_bytes + real(self._flow_bytes), self._replay_busy_s + real(self._flow_busy_s),
                np.maximum(self._replay_peak, real(self._flow_peak)))

    def link_stats(self, window_s: float) -> LinkStats:
        """Per-link totals; utilisation = bytes / (bandwidth x window); the load timeline in time
        order of the TIMELINE_LINKS hottest links (the whole one of a big run is tens of millions
        of changes)."""
        link_bytes, busy_s, peak = self._link_totals()
        util = link_bytes / (self.capacity_Bps * window_s) if window_s > 0 else np.zeros(self.num_links)
        hottest = np.lexsort((np.arange(self.num_links), -util))[:TIMELINE_LINKS]
        return LinkStats(self.link_names, self.capacity_Bps, link_bytes, busy_s, util, peak, self._load_timeline(hottest))

    # -- collectives timed once, replayed ------------------------------------------------------

    def recording(self) -> Recording:
        """What this network did so far, to be replayed elsewhere: for a collective run alone on
        a `fresh` network (see sim.shortcut); never itself a replay's host."""
        link_bytes, busy_s, peak = self._link_totals()
        used = np.flatnonzero(link_bytes)
        src, dst, start, end, nbytes, _, ptr, links = self._messages()
        return Recording(self.env.now, used, link_bytes[used], busy_s[used], peak[used], self._load_timeline(),
                         (src, dst, start, end, nbytes, ptr, links), self.reshares, self.flows_reshared)

    def replay(self, recording: Recording, start_s: float, label: str) -> None:
        """Add a recording's link statistics, load changes and messages as if it had run from
        `start_s` under `label`. Exact only where nothing else used its links meanwhile."""
        r = recording
        self._replay_bytes[r.links] += r.bytes
        self._replay_busy_s[r.links] += r.busy_s
        np.maximum.at(self._replay_peak, r.links, r.peak_flows)
        self._replays.append((r, start_s, len(self._labels), self._next_place()))
        self._replayed_messages += len(r.messages[0])
        self._labels.append(label)
        self.reshares += r.reshares
        self.flows_reshared += r.flows_reshared


def _sub_csr(ptr: np.ndarray, values: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of a CSR selected by a boolean mask, as a new CSR."""
    picked = np.flatnonzero(rows)
    new_ptr = np.zeros(len(picked) + 1, dtype=np.int64)
    np.cumsum(row_lengths(ptr)[picked], out=new_ptr[1:])
    return new_ptr, values[concat_ranges(ptr[picked], ptr[picked + 1])]
