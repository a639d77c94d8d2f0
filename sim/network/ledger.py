"""What a network delivered: its messages, replays, per-link statistics and load timeline.

sim.network moves the flows; this keeps the record, cheap to write during a run and turned into a
FlowTable and LinkStats at its end. Flows' statistics are kept by flow link (in a symmetric run a
canonical link stands for its orbit, sim.network.orbits) and handed to every link of the orbit at the
end; replays' are kept by link. Replays only use links no flow uses (sim.scale.shortcut), so the two
just add up. Past LISTED_MESSAGES_MAX replayed and orbit messages, those are summed per stream
instead of listed, and the load timeline given out is the TIMELINE_LINKS hottest links'.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from clustersim.sim.network.maxmin import concat_ranges, row_lengths
from clustersim.sim.network.orbits import Orbits
from clustersim.sim.network.records import FlowTable, LinkStats
from clustersim.sim.network.summed import summed_messages
from clustersim.sim.network.timeline import load_timeline

LISTED_MESSAGES_MAX = 2_000_000  # past this many replayed and orbit messages, those are summed per stream
TIMELINE_LINKS = 16  # the load timeline link_stats gives: of this many hottest links (what links.png draws)


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


class Ledger:
    """The record of one network's run (see the module docstring)."""

    def __init__(self, link_names: tuple[str, ...], capacity_Bps: np.ndarray, orbits: Orbits | None):
        self.num_links = num_links = len(capacity_Bps)
        self.link_names, self.capacity_Bps, self.orbits = link_names, capacity_Bps, orbits
        self._orbit_size = orbits.size if orbits is not None else 1  # messages one orbit record stands for
        self.labels: list[str] = []  # group id -> label
        self._flow_bytes = np.zeros(num_links)
        # per flow link, Python lists: a change touches a handful of links (numpy's per-call cost would dominate)
        self._flow_busy_s, self._flow_peak = [0.0] * num_links, [0] * num_links
        self._busy_from: list[float | None] = [None] * num_links  # since when a link carries flows (None: idle)
        self._replay_counts: dict[int, list] = {}  # id(recording) -> [recording, times replayed]
        # load changes: time, flow link, new load, and the place of their batch (a `loads` call) among the
        # batches and replays, to keep changes at one instant in their order
        self._changes: tuple[list[float], list[int], list[float], list[int]] = ([], [], [], [])
        self._batches = 0  # calls of `loads` so far
        self._load = [0.0] * num_links  # the load now, by flow link
        self._done: list[tuple] = []  # delivered messages, a batch of arrays per finish
        self._orbit_records: list[tuple] = []  # delivered orbits: (members, start, end, bytes, group id)
        self._orbit_messages = 0
        self._signals: list[tuple[int, int, float, float, str]] = []  # zero-byte messages (src, dst, start, end, label)
        self._replays: list[tuple[Recording, float, int, int]] = []  # (recording, start, group id, place)

    # -- during the run ------------------------------------------------------------------------

    def group(self, label: str) -> int:
        """A new group id under `label`."""
        self.labels.append(label)
        return len(self.labels) - 1

    def record(self, src, dst, start, end, nbytes, group, ptr, links) -> None:
        """Delivered messages (columns, route CSR)."""
        groups = group if isinstance(group, np.ndarray) else np.full(src.shape, group)  # a group id per message
        self._done.append((src, dst, start, end, nbytes, groups, ptr, links))

    def record_orbits(
        self, members: list[tuple], start: list[float], end: list[float], nbytes: list[float], groups: list[int]
    ) -> None:
        """Delivered orbits, each one's members (src, dst, route CSR) listed or summed at the end."""
        self._orbit_records.extend(zip(members, start, end, nbytes, groups))
        self._orbit_messages += len(members) * self._orbit_size

    def signal(self, src: int, dst: int, start_s: float, end_s: float, label: str) -> None:
        """A zero-byte message: no route, a label of its own."""
        self._signals.append((src, dst, start_s, end_s, label))

    def add_bytes(self, links: np.ndarray, nbytes: np.ndarray, distinct: bool = False) -> None:
        """Bytes of started flows, per (flow, flow link) pair (`distinct`: no link twice, one add)."""
        if distinct:
            self._flow_bytes[links] += nbytes
        else:
            np.add.at(self._flow_bytes, links, nbytes)

    def loads(self, now: float, links: np.ndarray, load: np.ndarray, count: np.ndarray, per_link=None) -> None:
        """The flow links `links` (distinct) carry `count` flows at total rate `load` from `now`:
        load changes, peak flows and busy time. `per_link`: each link's real flows per quotient flow
        (sim.network.orbits; load and count are the quotient's, the count rounded to the nearest)."""
        current, peak, since, busy_s = self._load, self._flow_peak, self._busy_from, self._flow_busy_s
        times, changed, loads, places = self._changes
        before = len(changed)
        new_loads, counts = load.tolist(), count.tolist()
        if per_link is not None:
            new_loads = [x * scale for x, scale in zip(new_loads, per_link.tolist())]
            counts = [round(n * scale) for n, scale in zip(counts, per_link.tolist())]  # half to even, as np.rint
        for link, new, flows in zip(links.tolist(), new_loads, counts):
            if new != current[link]:
                current[link] = new
                changed.append(link)
                loads.append(new)
            if flows > peak[link]:
                peak[link] = flows
            began = since[link]
            if flows > 0:
                if began is None:
                    since[link] = now
            elif began is not None:
                busy_s[link] += now - began
                since[link] = None
        moved = len(changed) - before
        times.extend([now] * moved)
        places.extend([self._batches + len(self._replays)] * moved)
        self._batches += 1

    def replay(self, recording: Recording, start_s: float, label: str) -> None:
        """A recording's link statistics, load changes and messages, as if run from `start_s`."""
        if (counted := self._replay_counts.get(id(recording))) is None:
            counted = self._replay_counts[id(recording)] = [recording, 0]
        counted[1] += 1
        self._replays.append((recording, start_s, len(self.labels), self._batches + len(self._replays)))
        self.labels.append(label)

    def _next_place(self) -> int:
        """The place of the next batch of load changes or replay, in the order they happen."""
        return self._batches + len(self._replays)

    # -- at the end ------------------------------------------------------------------------------

    def _flush_signals(self) -> None:
        """Move the zero-byte signals into the message records: route-less, each its own label."""
        if self._signals:
            src, dst, start, end, labels = zip(*self._signals)
            first = len(self.labels)
            self.labels.extend(labels)
            self._signals.clear()
            self.record(
                np.array(src),
                np.array(dst),
                np.array(start),
                np.array(end),
                np.zeros(len(src)),
                np.arange(first, first + len(src)),
                np.zeros(len(src) + 1, np.int64),
                np.zeros(0, np.int64),
            )

    def _listing(self) -> bool:
        """Whether replayed and orbit messages are listed one by one (else summed, see flow_table)."""
        replayed = sum(len(r.messages[0]) * times for r, times in self._replay_counts.values())
        return replayed + self._orbit_messages <= LISTED_MESSAGES_MAX

    def _orbit_columns(self) -> list[tuple]:
        """The finished orbits' members as record batches."""
        if not self._orbit_records:
            return []
        size = self._orbit_size
        return [
            (src, dst, np.full(size, start), np.full(size, end), np.full(size, nbytes), np.full(size, gid), ptr, route)
            for (src, dst, ptr, route), start, end, nbytes, gid in self._orbit_records
        ]

    def messages(self) -> tuple:
        """Every delivered message so far as one batch of columns (src, dst, start, end, bytes,
        group, route CSR), zero-byte signals included, replayed ones too while they are listed."""
        self._flush_signals()
        records = self._done
        if self._listing():
            records = records + self._orbit_columns()
        if self._replays and self._listing():
            records = records + [
                (src, dst, start + at, end + at, nbytes, np.broadcast_to(gid, src.shape), ptr, route)
                for (src, dst, start, end, nbytes, ptr, route), at, gid in (
                    (r.messages, at, gid) for r, at, gid, _ in self._replays
                )
            ]
        if not records:
            empty = np.zeros(0)
            return (
                empty,
                empty,
                empty,
                empty,
                empty,
                np.zeros(0, np.int64),
                np.zeros(1, np.int64),
                np.zeros(0, np.int64),
            )
        columns = [np.concatenate([np.asarray(r[i]) for r in records]) for i in range(6)]
        lengths = np.concatenate([row_lengths(r[6]) for r in records])
        ptr = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=ptr[1:])
        return (*columns, ptr, np.concatenate([r[7] for r in records]))

    def flow_table(self) -> FlowTable:
        """Every delivered message, in delivery order (ties: the order they were recorded)."""
        src, dst, start, end, nbytes, group, ptr, links = self.messages()
        order = np.argsort(end, kind="stable")
        lengths = row_lengths(ptr)[order]
        new_ptr = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(lengths, out=new_ptr[1:])
        return FlowTable(
            src[order].astype(np.int64),
            dst[order].astype(np.int64),
            start[order].astype(float),
            end[order].astype(float),
            nbytes[order].astype(float),
            group[order].astype(np.int64),
            tuple(self.labels),
            new_ptr,
            links[concat_ranges(ptr[order], ptr[order + 1])],
            self._summed(),
        )

    def _summed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Past LISTED_MESSAGES_MAX, the replayed and orbit messages as (src, dst, bytes, label),
        summed by one stream over the replays of each recording and over the orbits of each
        members' list (labelled by the first one's label)."""
        if self._listing():
            return FlowTable.summed_default()
        return summed_messages(self._replays, self._orbit_records, self.labels)

    def load_timeline(self, links: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every load change in time order, replays included (changes at one instant in the order
        they happened); of `links` only when given (sim.network.timeline)."""
        canon = self.orbits.canon if self.orbits is not None else None
        times, changed, loads, places = self._changes
        changes = (
            np.array(times, float),
            np.array(changed, np.int64),
            np.array(loads, float),
            np.array(places, np.int64),
        )
        return load_timeline(changes, self._replays, canon, self.num_links, links)

    def recording(self, duration_s: float, reshares: int, flows_reshared: int) -> Recording:
        """What was recorded so far, as a Recording to replay elsewhere (never itself a replay's
        host: a recording holds flows only)."""
        link_bytes, busy_s, peak = self.link_totals()
        used = np.flatnonzero(link_bytes)
        src, dst, start, end, nbytes, _, ptr, links = self.messages()
        return Recording(
            duration_s,
            used,
            link_bytes[used],
            busy_s[used],
            peak[used],
            self.load_timeline(),
            (src, dst, start, end, nbytes, ptr, links),
            reshares,
            flows_reshared,
        )

    def link_totals(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bytes, busy seconds, peak flows) per link: the replays' plus the flows' (a flow link's
        for every link of its orbit)."""
        canon = self.orbits.canon if self.orbits is not None else slice(None)
        link_bytes = self._flow_bytes[canon].copy()
        busy_s, peak = np.array(self._flow_busy_s)[canon], np.array(self._flow_peak, np.int64)[canon]
        for r, times in self._replay_counts.values():  # each recording's totals, times its replays
            link_bytes[r.links] += times * r.bytes
            busy_s[r.links] += times * r.busy_s
            np.maximum.at(peak, r.links, r.peak_flows)
        return link_bytes, busy_s, peak

    def link_stats(self, window_s: float) -> LinkStats:
        """Per-link totals; utilisation = bytes / (bandwidth x window); the load timeline in time
        order of the TIMELINE_LINKS hottest links (the whole one of a big run is tens of millions
        of changes)."""
        link_bytes, busy_s, peak = self.link_totals()
        util = link_bytes / (self.capacity_Bps * window_s) if window_s > 0 else np.zeros(self.num_links)
        hottest = np.lexsort((np.arange(self.num_links), -util))[:TIMELINE_LINKS]
        return LinkStats(
            self.link_names, self.capacity_Bps, link_bytes, busy_s, util, peak, self.load_timeline(hottest)
        )
