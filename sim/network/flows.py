"""The flows in flight, as arrays: bytes left, rates, paths (both CSR views), per-link load.

Finished flows are only marked dead (rate 0, frozen forever) and swept out when they outnumber
the living, so a batch of finishes costs work in proportion to the flows it touches, not to all
flows in flight. Per-link flow counts and loads (sum of rates) are kept up to date the same way,
and so is each flow's drain: `remaining` bytes as of time `since`, and the absolute time
`finish_at` it will finish at its rate; only flows whose rate changes are brought up to date.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from clustersim.sim.network.maxmin import concat_ranges, fill, link_csr, rates_that_survive, row_lengths


class Flows(Protocol):
    """What the network asks of its flows in flight: this module's arrays, or sim.network.few_flows'
    objects for a quotient's handful. Flow ids are whatever `add` and `next_finish` give."""

    touched: np.ndarray  # links whose load or count the last change touched
    last_refilled: int  # flows the last fill worked on (a speed measure)

    @property
    def num_alive(self) -> int: ...
    def add(
        self, ptr: np.ndarray, links: np.ndarray, *, nbytes, latency, start, src, dst, group, members=None
    ) -> Any: ...
    def fill_component(self, seeds: Any, now: float) -> None: ...
    def finish(self, gone: Any, now: float) -> None: ...
    def take(self, ids: Any, name: str) -> np.ndarray: ...
    def loads(self, links: np.ndarray) -> np.ndarray: ...
    def counts(self, links: np.ndarray) -> np.ndarray: ...
    def next_finish(self, now: float, together: float) -> tuple[float, Any]: ...


PER_FLOW = ("remaining", "since", "finish_at", "rate", "nbytes", "latency", "start", "src", "dst", "group", "alive")


class ActiveFlows:
    """Struct of arrays over flows; `alive` marks the ones still moving."""

    def __init__(self, capacity_Bps: np.ndarray):
        self.capacity_Bps = capacity_Bps
        num_links = len(capacity_Bps)
        self.remaining = np.zeros(0)  # bytes left at time `since`
        self.since = np.zeros(0)
        self.finish_at = np.zeros(0)  # absolute finish time at the current rate (inf when dead)
        self.rate = np.zeros(0)
        self.nbytes = np.zeros(0)
        self.latency = np.zeros(0)
        self.start = np.zeros(0)
        self.src = np.zeros(0, dtype=np.int64)
        self.dst = np.zeros(0, dtype=np.int64)
        self.group = np.zeros(0, dtype=np.int64)
        self.alive = np.zeros(0, dtype=bool)
        self.flow_ptr = np.zeros(1, dtype=np.int64)
        self.flow_links = np.zeros(0, dtype=np.int64)
        self.link_ptr = np.zeros(num_links + 1, dtype=np.int64)
        self.link_flows = np.zeros(0, dtype=np.int64)
        self.count = np.zeros(num_links, dtype=np.int64)  # living flows per link
        self.load = np.zeros(num_links)  # sum of living flows' rates per link
        self.num_alive = 0
        self.last_refilled = 0  # flows the last fill worked on (a speed measure)
        self.touched = np.zeros(0, dtype=np.int64)  # links whose load or count the last fill changed

    def pairs_of(self, flows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(link ids, owning flow's position in `flows`) of every (flow, link) pair of `flows`."""
        starts, ends = self.flow_ptr[flows], self.flow_ptr[flows + 1]
        return self.flow_links[concat_ranges(starts, ends)], np.repeat(np.arange(len(flows)), ends - starts)

    def add(self, ptr: np.ndarray, links: np.ndarray, **columns) -> np.ndarray:
        """Append flows (paths as CSR, each listing a link at most once: maxmin.fill counts a
        flow once per link; one value per flow per column of PER_FLOW but alive/rate); their
        indices."""
        n = len(ptr) - 1
        first = len(self.alive)
        columns.update(
            rate=np.zeros(n),
            alive=np.ones(n, dtype=bool),
            remaining=columns["nbytes"],
            since=columns["start"],
            finish_at=np.full(n, np.inf),
        )
        for name in PER_FLOW:
            setattr(self, name, np.concatenate([getattr(self, name), columns[name]]))
        self.flow_ptr = np.concatenate([self.flow_ptr, self.flow_ptr[-1] + ptr[1:]])
        self.flow_links = np.concatenate([self.flow_links, links])
        self.link_ptr, self.link_flows = link_csr(self.flow_ptr, self.flow_links, len(self.capacity_Bps))
        self.count += np.bincount(links, minlength=len(self.count))
        self.num_alive += n
        return np.arange(first, first + n)

    def take(self, flows: np.ndarray, name: str) -> np.ndarray:
        """One column's values for `flows`."""
        return getattr(self, name)[flows]

    def loads(self, links: np.ndarray) -> np.ndarray:
        return self.load[links]

    def counts(self, links: np.ndarray) -> np.ndarray:
        return self.count[links]

    def _drain(self, flows: np.ndarray, now: float) -> None:
        """Bring `flows`' remaining bytes up to `now` at their current rates."""
        self.remaining[flows] -= self.rate[flows] * (now - self.since[flows])
        self.since[flows] = now

    def _plan(self, flows: np.ndarray, now: float) -> None:
        """Finish times of `flows` at their (new) rates."""
        self.finish_at[flows] = now + np.maximum(self.remaining[flows], 0.0) / self.rate[flows]

    def component(self, seeds: np.ndarray) -> np.ndarray:
        """The living flows connected to `seeds` through shared links (breadth-first over the
        incidence, a frontier at a time). Max-min rates of flows outside it cannot change when
        flows inside it start."""
        if len(seeds) == self.num_alive:  # the seeds are everything in flight
            return seeds
        inside = np.zeros(len(self.alive), dtype=bool)
        inside[seeds] = True
        seen = np.zeros(len(self.count), dtype=bool)
        frontier = seeds
        while len(frontier):
            links = np.unique(self.flow_links[concat_ranges(self.flow_ptr[frontier], self.flow_ptr[frontier + 1])])
            links = links[~seen[links]]
            seen[links] = True
            flows = self.link_flows[concat_ranges(self.link_ptr[links], self.link_ptr[links + 1])]
            frontier = np.unique(flows[self.alive[flows] & ~inside[flows]])
            inside[frontier] = True
        return np.flatnonzero(inside)

    def fill_component(self, seeds: np.ndarray, now: float) -> None:
        """Max-min rates for the component of `seeds` (new flows) from scratch; the rest keep theirs."""
        refill = self.component(seeds)
        self._drain(refill, now)
        links, of = self.pairs_of(refill)
        num_links = len(self.count)
        self.load -= np.bincount(links, weights=self.rate[refill][of], minlength=num_links)
        self._refill(refill, links, of, now)
        self.touched = np.unique(links)

    def _refill(self, refill: np.ndarray, links: np.ndarray, of: np.ndarray, now: float) -> None:
        """Max-min rates for flows `refill` (whose load is already off their links `links`, pair
        by pair with `of`) over the capacity the other flows leave; their load back on, their
        finishes planned."""
        num_links = len(self.count)
        self.rate[refill] = 0.0
        frozen = np.ones(len(self.alive), dtype=bool)
        frozen[refill] = False
        fill(
            self.flow_ptr,
            self.flow_links,
            self.link_ptr,
            self.link_flows,
            np.maximum(self.capacity_Bps - self.load, 0.0),
            np.bincount(links, minlength=num_links).astype(float),
            frozen,
            self.rate,
        )
        self.load += np.bincount(links, weights=self.rate[refill][of], minlength=num_links)
        self._plan(refill, now)
        self.last_refilled = len(refill)

    def finish(self, gone: np.ndarray, now: float) -> None:
        """Mark flows `gone` (indices) dead and re-fill only the flows whose rate may change."""
        leaving = np.zeros(len(self.alive), dtype=bool)
        leaving[gone] = True
        refill = np.flatnonzero(self.alive & ~rates_that_survive(self.rate, leaving) & ~leaving)
        self._drain(refill, now)
        gone_links, gone_of = self.pairs_of(gone)
        refill_links, refill_of = self.pairs_of(refill)
        num_links = len(self.count)
        self.load -= np.bincount(gone_links, weights=self.rate[gone][gone_of], minlength=num_links)
        self.load -= np.bincount(refill_links, weights=self.rate[refill][refill_of], minlength=num_links)
        self.count -= np.bincount(gone_links, minlength=num_links)
        self.alive[gone] = False
        self.rate[gone] = 0.0
        self.finish_at[gone] = np.inf
        self.num_alive -= len(gone)
        self._refill(refill, refill_links, refill_of, now)
        self.touched = np.unique(np.concatenate([gone_links, refill_links]))
        if len(self.alive) > 64 and self.num_alive < len(self.alive) // 2:
            self._sweep()

    def _sweep(self) -> None:
        """Drop dead flows from every array, keeping both CSR views in order (no re-sort)."""
        keep = self.alive
        new_id = np.cumsum(keep) - 1
        kept = np.flatnonzero(keep)
        lengths = row_lengths(self.flow_ptr)[kept]
        self.flow_links = self.flow_links[concat_ranges(self.flow_ptr[kept], self.flow_ptr[kept + 1])]
        self.flow_ptr = np.zeros(len(kept) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.flow_ptr[1:])
        link_of = np.repeat(np.arange(len(self.count)), row_lengths(self.link_ptr))
        living = keep[self.link_flows]
        self.link_flows = new_id[self.link_flows[living]]
        self.link_ptr = np.zeros(len(self.count) + 1, dtype=np.int64)
        np.cumsum(np.bincount(link_of[living], minlength=len(self.count)), out=self.link_ptr[1:])
        for name in PER_FLOW:
            setattr(self, name, getattr(self, name)[keep])

    def next_finish(self, now: float, together: float) -> tuple[float, np.ndarray]:
        """Delay to the first finish, and the flows (indices) finishing within a relative
        `together` of that delay."""
        first = float(self.finish_at.min())
        delay = max(first - now, 0.0)
        return delay, np.flatnonzero(self.finish_at <= now + delay * (1 + together))
