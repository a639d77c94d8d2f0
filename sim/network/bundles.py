"""Starts on free links as one record: a pattern filled once, moved as a bundle until something joins it.

Under replica classes (sim.scale.symmetry) a pipeline send starts a dozen quotient flows at once
(one per image block of its class), and nine times in ten on links no other flow crosses. Their
max-min rates are then their own (each link shared among the new flows alone, FewFlows._local's
case) and the same every time the pattern recurs. BundledFlows fills a pattern once (`template`)
and, when it starts on free links with one rate, bytes and latency for all its flows, keeps them
as one record: nothing else crosses its links, so no change elsewhere alters that rate, and its
flows finish together. When a later start reaches one of its links the bundle is expanded in
place into the flows it stands for, as they would have been, and the normal filling goes on. So
every rate, finish and load is bit for bit FewFlows'; only the per-flow work of the common case goes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clustersim.sim.network.few_flows import SURVIVE, FewFlows, _Flow


@dataclass(frozen=True)
class Template:
    """A pattern's flows as FewFlows fills them alone: one rate, their links, their loads."""

    rate: float
    nbytes: float
    latency: float
    paths: list[list[int]]  # each flow's links
    src: list[int]
    dst: list[int]
    members: list  # what each flow stands for
    crossings: dict[int, int]  # link -> how many times the flows cross it
    loads: dict[int, float]  # link -> its load after the fill
    touched: np.ndarray  # the links, sorted
    touched_loads: np.ndarray  # their loads and flow counts, in that order
    touched_counts: np.ndarray


class _Bundle(_Flow):
    __slots__ = ("parts",)
    parts: Template


class BundledFlows(FewFlows):
    """FewFlows that start a Template on free links as one bundle (see the module docstring)."""

    def __init__(self, capacity_Bps: np.ndarray):
        super().__init__(capacity_Bps)
        self._known: tuple[np.ndarray, ...] = ()  # (touched, their loads, counts) after a bundle's change

    def loads(self, links: np.ndarray) -> np.ndarray:
        """FewFlows.loads; known without a look-up for the links a bundle's start or finish touched."""
        return self._known[1] if self._known and links is self._known[0] else super().loads(links)

    def counts(self, links: np.ndarray) -> np.ndarray:
        return self._known[2] if self._known and links is self._known[0] else super().counts(links)

    @staticmethod
    def template(capacity_Bps: np.ndarray, ptr: np.ndarray, links: np.ndarray, columns: dict) -> Template | None:
        """The fill of flows (CSR paths, Network's columns) started alone, or None if they do not
        share one rate, size and latency (then they move as separate flows)."""
        n = len(ptr) - 1
        scratch = FewFlows(capacity_Bps)
        ids = scratch.add(ptr, links, start=np.zeros(n), group=np.zeros(n, np.int64), **columns)
        scratch.fill_component(ids, 0.0)
        flows = [scratch._flows[fid] for fid in ids]
        first = flows[0]
        if first.rate <= 0 or any(
            (f.rate, f.nbytes, f.latency) != (first.rate, first.nbytes, first.latency) for f in flows
        ):
            return None
        return Template(
            first.rate,
            first.nbytes,
            first.latency,
            [f.links for f in flows],
            [f.src for f in flows],
            [f.dst for f in flows],
            [f.members for f in flows],
            dict(scratch._count),
            dict(scratch._load),
            scratch.touched.copy(),
            scratch.loads(scratch.touched),
            scratch.counts(scratch.touched),
        )

    def start(self, t: Template, now: float, group: int) -> list[int] | None:
        """Start `t`'s flows as one bundle if none of its links carries a flow (its id), else None."""
        on = self._on
        if not on.keys().isdisjoint(t.crossings):
            return None
        fid = self._next_id
        self._next_id += len(t.paths)  # its flows' ids, should it be expanded
        bundle = _Bundle()
        bundle.parts, bundle.links = t, list(t.crossings)
        bundle.nbytes = bundle.remaining = t.nbytes
        bundle.latency, bundle.group, bundle.members = t.latency, group, None  # members: its parts'
        bundle.src, bundle.dst = t.src[0], t.dst[0]
        bundle.start = bundle.since = now
        bundle.rate, bundle.finish_at = t.rate, now + max(t.nbytes, 0.0) / t.rate
        self._flows[fid] = bundle
        for link in t.crossings:
            on[link] = {fid: None}
        self._count.update(t.crossings)
        self._load.update(t.loads)
        self.touched, self.last_refilled = t.touched, len(t.paths)
        self._known = (t.touched, t.touched_loads, t.touched_counts)
        return [fid]

    def add(self, ptr, links, nbytes, latency, start, src, dst, group, members=None) -> list[int]:
        """FewFlows.add, after expanding the bundles on the new flows' links."""
        flows, on = self._flows, self._on
        hit = {fid for link in links.tolist() if link in on for fid in on[link] if type(flows[fid]) is _Bundle}
        for fid in sorted(hit):
            self._expand(fid)
        return super().add(ptr, links, nbytes, latency, start, src, dst, group, members)

    def _expand(self, fid: int) -> None:
        """Put the flows bundle `fid` stands for in its place (ids, order, rates, bytes left)."""
        bundle = self._flows[fid]
        assert isinstance(bundle, _Bundle)
        t = bundle.parts
        flows: dict[int, _Flow] = {}
        for key, flow in self._flows.items():
            if key != fid:
                flows[key] = flow
                continue
            for j, (path, src, dst, members) in enumerate(zip(t.paths, t.src, t.dst, t.members)):
                part = flows[fid + j] = _Flow()
                part.links, part.src, part.dst, part.members, part.group = path, src, dst, members, bundle.group
                part.nbytes, part.latency, part.remaining = t.nbytes, t.latency, bundle.remaining
                part.start, part.since, part.rate, part.finish_at = (
                    bundle.start,
                    bundle.since,
                    bundle.rate,
                    bundle.finish_at,
                )
        self._flows = flows
        on = self._on
        for link in t.crossings:
            on[link] = dict.fromkeys(fid + j for j, path in enumerate(t.paths) if link in path)

    def finish(self, gone: list[int], now: float, floor: float | None = None) -> None:
        """FewFlows.finish; a bundle leaves its links free (nothing else crosses them)."""
        flows = self._flows
        bundles = [fid for fid in gone if type(flows[fid]) is _Bundle]
        if not bundles:
            return super().finish(gone, now)
        floor = min(flows[fid].rate for fid in gone) * SURVIVE
        on, count, load = self._on, self._count, self._load
        freed = []
        for fid in bundles:
            for link in flows.pop(fid).links:
                del on[link], count[link], load[link]
                freed.append(link)
        rest = [fid for fid in gone if fid in flows]
        if rest:
            super().finish(rest, now, floor)
            self.touched = np.unique(np.concatenate([np.array(freed, dtype=np.int64), self.touched]))
        else:
            self.touched, self.last_refilled = np.unique(np.array(freed, dtype=np.int64)), 0
            empty = np.zeros(len(self.touched))
            self._known = (self.touched, empty, empty.astype(np.int64))  # nothing else crossed them

    def weights(self, ids: list[int]) -> np.ndarray:
        """How many flows each id stands for (a bundle's, else 1)."""
        flows = self._flows
        return np.array([len(f.parts.paths) if type(f) is _Bundle else 1 for f in (flows[i] for i in ids)], np.int64)

    def records(self, ids: list[int], landing: list[float], groups: list[int]) -> tuple[list, ...]:
        """Each finished flow's (members, start, end, bytes, group), a bundle's flows one by one."""
        members: list = []
        start: list[float] = []
        end: list[float] = []
        nbytes: list[float] = []
        group: list[int] = []
        for fid, landed, gid in zip(ids, landing, groups):
            flow = self._flows[fid]
            parts = flow.parts.members if type(flow) is _Bundle else [flow.members]
            k = len(parts)
            members += parts
            start += [flow.start] * k
            end += [landed] * k
            nbytes += [flow.nbytes] * k
            group += [gid] * k
        return members, start, end, nbytes, group
