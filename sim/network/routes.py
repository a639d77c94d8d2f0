"""Which links a message crosses and what latency it pays, cached: collectives repeat a few patterns.

A route is a row of a CSR (ptr, links) of link ids from the router (topologies.routing); a
message's latency is the sum of its links' latencies (0 to itself). A (sources, destinations)
pattern's routes are kept up to PATTERN_CACHE_SIZE patterns of at most PATTERN_MAX_MESSAGES
messages (a bigger one, an all-to-all, is a one-off); one pair's latency is kept for signals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from clustersim.sim.network.maxmin import concat_ranges, row_lengths
from clustersim.topologies.routing import Router

PATTERN_CACHE_SIZE = 4096  # (src, dst) patterns whose routes are kept
PATTERN_MAX_MESSAGES = 4096  # larger patterns are routed each time


class Routes:
    """Routes and path latencies over one fabric (`latency_s` per link id), with their caches."""

    def __init__(self, router: Router, latency_s: np.ndarray):
        self.router, self.latency_s = router, latency_s
        self._latency: dict[tuple[int, int], float] = {}
        self._patterns: dict[tuple[bytes, bytes], Any] = {}

    def fresh(self) -> Routes:
        """The same routes with a pattern cache of its own (a quotient's patterns are not a plain
        network's) and the pair latencies shared."""
        twin = Routes(self.router, self.latency_s)
        twin._latency = self._latency
        return twin

    def cached(self, src: np.ndarray, dst: np.ndarray, make: Callable[[np.ndarray, np.ndarray], Any]) -> Any:
        """make(src, dst), cached by the (src, dst) pattern."""
        return kept(self._patterns, (src.tobytes(), dst.tobytes()), len(src), lambda: make(src, dst))

    def route(self, src: np.ndarray, dst: np.ndarray, routed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ptr, links) of the `routed` messages' routes (CSR) and every message's latency."""
        ptr, links = (
            self.router.route_many(src[routed], dst[routed])
            if routed.any()
            else (np.zeros(1, np.int64), np.zeros(0, np.int64))
        )
        latency = np.zeros(len(src))
        if len(links):
            latency[routed] = np.add.reduceat(self.latency_s[links], ptr[:-1])
        return ptr, links, latency

    def path_latency(self, src: int, dst: int) -> float:
        """Total latency of the route from GPU src to GPU dst (0 to itself), kept per pair."""
        latency_s = self._latency.get((src, dst))
        if latency_s is None:
            latency_s = self._latency[(src, dst)] = float(
                self.route(np.array([src]), np.array([dst]), np.array([src != dst]))[2][0]
            )
        return latency_s


def kept(store: dict, key: Any, messages: int, make: Callable[[], Any]) -> Any:
    """make(), kept in `store` under `key` for a pattern of at most PATTERN_MAX_MESSAGES messages (a
    bigger one, an all-to-all's bulk, is a one-off), `store` emptied when it holds PATTERN_CACHE_SIZE."""
    if messages > PATTERN_MAX_MESSAGES:
        return make()
    if key not in store:
        if len(store) >= PATTERN_CACHE_SIZE:
            store.clear()
        store[key] = make()
    return store[key]


def sub_csr(ptr: np.ndarray, values: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of a CSR selected by a boolean mask, as a new CSR."""
    picked = np.flatnonzero(rows)
    new_ptr = np.zeros(len(picked) + 1, dtype=np.int64)
    np.cumsum(row_lengths(ptr)[picked], out=new_ptr[1:])
    return new_ptr, values[concat_ranges(ptr[picked], ptr[picked + 1])]
