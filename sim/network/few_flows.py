"""The flows in flight when they are few, as Python objects: work in proportion to what a change touches.

A symmetric run's network (sim.network.orbits) keeps one flow per orbit, so a handful are in flight on
a fabric of a hundred thousand links. sim.network.flows' arrays span every link and cost a few numpy
calls per change whatever their size; here a start or a finish costs Python work on the flows
connected to it and their links only, nothing in proportion to the fabric. Same model and the
same filling rule as sim.network.flows and sim.network.maxmin (progressive filling, bottlenecks within a relative
TIE of the lowest share fill together; a finish re-fills only the flows at or above the slowest
leaver's rate, see maxmin.rates_that_survive); a path may list a link more than once (it then
counts that many times on it). A change whose flows share only unsaturated links with the rest
(a ring step on NICs of its own under a non-blocking tree) re-fills those flows alone: provably
the same allocation (FewFlows._local), at the cost of their links instead of their component.
"""

from __future__ import annotations

import itertools

import numpy as np

from clustersim.sim.network.maxmin import TIE

SURVIVE = 1 - 1e-9  # maxmin.rates_that_survive's margin below the slowest leaver's rate
INF = float("inf")
SATURATED = 1e-9  # a link loaded within this relative distance of its capacity is saturated


class _Flow:
    __slots__ = (
        "links",
        "remaining",
        "since",
        "rate",
        "finish_at",
        "nbytes",
        "latency",
        "start",
        "src",
        "dst",
        "group",
        "members",
    )
    links: list[int]
    remaining: float  # bytes left at time `since`
    since: float
    rate: float
    finish_at: float
    nbytes: float
    latency: float
    start: float
    src: int
    dst: int
    group: int
    members: object  # what the flow stands for (a quotient's orbit members)


class FewFlows:
    """Flows by id (ids count up from 0), the links they cross, per-link load and flow count."""

    def __init__(self, capacity_Bps: np.ndarray):
        self.capacity_Bps = capacity_Bps  # read when a fill needs a link (it may be set late, sim.network.orbits)
        self._flows: dict[int, _Flow] = {}
        self._on: dict[int, dict[int, None]] = {}  # link -> the flows crossing it (insertion order)
        self._load: dict[int, float] = {}
        self._count: dict[int, int] = {}
        self._next_id = 0
        self.touched = np.zeros(0, dtype=np.int64)  # links whose load or count the last change touched
        self.last_refilled = 0

    @property
    def num_alive(self) -> int:
        return len(self._flows)

    def add(
        self, ptr: np.ndarray, links: np.ndarray, nbytes, latency, start, src, dst, group, members: list | None = None
    ) -> list[int]:
        """New flows (paths as CSR, one value per flow per column; `members`: what each stands
        for, any object, given back when it lands: BundledFlows.records); their ids."""
        flows, on, count = self._flows, self._on, self._count
        paths, bounds = links.tolist(), ptr.tolist()
        first, n = self._next_id, len(bounds) - 1
        self._next_id = first + n
        columns = (nbytes.tolist(), latency.tolist(), start.tolist(), src.tolist(), dst.tolist(), group.tolist())
        for fid, lo, hi, size, lat, begin, s, d, g, m in zip(
            range(first, first + n), bounds, bounds[1:], *columns, members or itertools.repeat(None, n)
        ):
            flow = _Flow()
            flow.links = path = paths[lo:hi]
            flow.nbytes = flow.remaining = size
            flow.latency, flow.src, flow.dst, flow.group, flow.members = lat, s, d, g, m
            flow.start = flow.since = begin
            flow.rate, flow.finish_at = 0.0, INF
            flows[fid] = flow
            for link in path:
                crossing = on.get(link)
                if crossing is None:
                    on[link], count[link] = {fid: None}, 1
                else:
                    crossing[fid] = None
                    count[link] += 1
        return list(range(first, first + n))

    def take(self, ids: list[int], name: str) -> np.ndarray:
        """One column's values for `ids`, as an array."""
        return np.array([getattr(self._flows[i], name) for i in ids])

    def loads(self, links: np.ndarray) -> np.ndarray:
        load = self._load
        return np.array([load.get(link, 0.0) for link in links.tolist()])

    def counts(self, links: np.ndarray) -> np.ndarray:
        count = self._count
        return np.array([count.get(link, 0) for link in links.tolist()], dtype=np.int64)

    def component(self, seeds: list[int]) -> list[int]:
        """The flows connected to `seeds` through shared links (their rates are the only ones a
        start can change)."""
        flows, on = self._flows, self._on
        inside = dict.fromkeys(seeds)
        seen: set[int] = set()
        frontier = list(seeds)
        while frontier:
            nxt = []
            for fid in frontier:
                for link in flows[fid].links:
                    if link not in seen:
                        seen.add(link)
                        for other in on[link]:
                            if other not in inside:
                                inside[other] = None
                                nxt.append(other)
            frontier = nxt
        return list(inside)

    def fill_component(self, seeds: list[int], now: float) -> None:
        """Max-min rates for new flows `seeds`: on their own when that is provably the max-min
        allocation (`_local`), else for their whole component from scratch; the rest keep theirs."""
        if self._local(seeds, now):
            return
        refill = self.component(seeds)
        self._refill(refill, now)
        self.touched = np.unique(np.array([link for fid in refill for link in self._flows[fid].links], dtype=np.int64))

    def finish(self, gone: list[int], now: float, floor: float | None = None) -> None:
        """Remove flows `gone`; re-fill the flows whose rate may change: those connected to the
        leavers through shared links (the others share no link with them) and not slower than
        the slowest leaver (rates_that_survive; `floor`: the slowest of a larger batch, if given)."""
        flows, load, count, on, capacity = self._flows, self._load, self._count, self._on, self.capacity_Bps
        if floor is None:
            floor = min(flows[fid].rate for fid in gone) * SURVIVE
        touched: dict[int, None] = {}  # the leavers' links, first met before any leaver leaves them
        saturated = []  # those of them saturated with the leavers on
        for fid in gone:
            flow = flows.pop(fid)
            for link in flow.links:
                if link not in touched:
                    touched[link] = None
                    if load[link] >= capacity.item(link) * (1 - SATURATED):
                        saturated.append(link)
                count[link] -= 1
                load[link] -= flow.rate
                if count[link] == 0:
                    del count[link], load[link], on[link]
                else:
                    on[link].pop(fid, None)
        freed = np.fromiter(touched, dtype=np.int64, count=len(touched))
        # only a flow bottlenecked on a link the leavers saturated may gain (_local's argument)
        seeds = sorted({fid for link in saturated for fid in on.get(link, ()) if not flows[fid].rate < floor})
        if not seeds:
            freed.sort()
            self.touched, self.last_refilled = freed, 0
            return
        if self._local(seeds, now):
            self.touched = np.unique(np.concatenate([freed, self.touched]))
            return
        # max-min rates split over connected components: only the leavers' component can change
        neighbours = dict.fromkeys(fid for link in touched for fid in on.get(link, ()))
        refill = sorted(fid for fid in self.component(list(neighbours)) if not flows[fid].rate < floor)
        self._refill(refill, now)
        again = np.array([link for fid in refill for link in flows[fid].links], dtype=np.int64)
        self.touched = np.unique(np.concatenate([freed, again]))

    def _local(self, seeds: list[int], now: float) -> bool:
        """Fill `seeds` against what the other flows leave of each link, and keep the result if
        it is the max-min allocation of all flows (True), which holds when every link the seeds
        cross and the others share is unsaturated before and after: then each seed freezes on a
        link only seeds fill (where no flow outdoes it), and each other flow's bottleneck is a
        link the seeds do not cross (a link they share with it is not saturated), untouched, so
        every flow still has its bottleneck and the allocation is the unique max-min one
        (Bertsekas and Gallager, Data Networks, 6.5.2). Cost: the seeds' links, not the
        component; a ring step on NICs of its own is the common case. False: nothing is
        final; the caller refills the component (from the rates as they now are)."""
        flows, load, count, capacity = self._flows, self._load, self._count, self.capacity_Bps
        own: dict[int, int] = {}  # link -> how many times the seeds cross it
        for fid in seeds:
            for link in flows[fid].links:
                own[link] = own.get(link, 0) + 1
        shared = [link for link, n in own.items() if count[link] > n]
        if any(load[link] >= capacity.item(link) * (1 - SATURATED) for link in shared):
            return False
        self._refill(seeds, now)
        self.touched = np.fromiter(own, dtype=np.int64, count=len(own))
        self.touched.sort()
        return not any(load[link] >= capacity.item(link) * (1 - SATURATED) for link in shared)

    def _refill(self, refill: list[int], now: float) -> None:
        """Progressive filling of `refill` against what the other flows leave of each link."""
        flows, load, capacity = self._flows, self._load, self.capacity_Bps
        unfrozen: dict[int, int] = {}
        owner: dict[int, int] = {}  # link -> the one refilled flow crossing it, or -1: more than one
        for fid in refill:
            flow = flows[fid]
            flow.remaining -= flow.rate * (now - flow.since)
            flow.since = now
            for link in flow.links:
                load[link] = load.get(link, 0.0) - flow.rate
                unfrozen[link] = unfrozen.get(link, 0) + 1
                if owner.setdefault(link, fid) != fid:
                    owner[link] = -1
            flow.rate = 0.0
        # max(x, 0.0) written out (0.0 if 0.0 > x else x, the same value): this loop is hot
        residual = {link: 0.0 if 0.0 > (r := capacity.item(link) - load[link]) else r for link in unfrozen}
        if -1 in owner.values():
            self._fill_together(refill, unfrozen, residual)
        else:  # no two share a link: each round's lowest share is a flow's own lowest
            lowest = sorted((min(residual[link] / unfrozen[link] for link in flows[fid].links), fid) for fid in refill)
            i = 0
            while i < len(lowest):
                best = lowest[i][0]
                while i < len(lowest) and lowest[i][0] <= best * (1 + TIE):
                    flows[lowest[i][1]].rate = best
                    i += 1
        for fid in refill:
            flow = flows[fid]
            for link in flow.links:
                load[link] += flow.rate
            flow.finish_at = now + max(flow.remaining, 0.0) / flow.rate if flow.rate > 0 else float("inf")
        self.last_refilled = len(refill)

    def _fill_together(self, refill: list[int], unfrozen: dict[int, int], residual: dict[int, float]) -> None:
        """Progressive filling of `refill` (their rates), given what the others leave of each link
        (`residual`) and how many times the flows cross it (`unfrozen`)."""
        flows, on = self._flows, self._on
        active = dict.fromkeys(refill)
        while active:
            shares = {link: residual[link] / n for link, n in unfrozen.items()}
            best = min(shares.values())
            newly = dict.fromkeys(
                fid for link, share in shares.items() if share <= best * (1 + TIE) for fid in on[link] if fid in active
            )
            for fid in newly:
                del active[fid]
                flow = flows[fid]
                flow.rate = best
                for link in flow.links:
                    unfrozen[link] -= 1
                    left = residual[link] - best
                    residual[link] = 0.0 if 0.0 > left else left
            unfrozen = {link: n for link, n in unfrozen.items() if n > 0}

    def next_finish(self, now: float, together: float) -> tuple[float, list[int]]:
        """Delay to the first finish, and the flows finishing within a relative `together` of it."""
        first = min(flow.finish_at for flow in self._flows.values())
        delay = max(first - now, 0.0)
        limit = now + delay * (1 + together)
        return delay, [fid for fid, flow in self._flows.items() if flow.finish_at <= limit]
