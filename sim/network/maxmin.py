"""Max-min fair rates by progressive filling, vectorised over a flows x links incidence in CSR form.

Progressive filling: raise every unfrozen flow's rate together; when a link fills, the flows on
it freeze at its fair share. Each round finds the bottleneck share

    best = min over links l with unfrozen flows of residual_l / unfrozen_l

freezes every unfrozen flow crossing a link at that share, and takes their rate off the links
they cross. A link is the bottleneck in at most one round (its unfrozen count then drops to 0),
so all rounds together touch each (flow, link) pair about twice: the cost is O(pairs + rounds x
links), with no Python loop over flows.

Result: no link carries more than its capacity, and every flow crosses a saturated link on which
no other flow gets a higher rate (the max-min optimality condition).
"""

from __future__ import annotations

import numpy as np

TIE = 1e-12  # links whose share is within this relative distance of the minimum fill together


def row_lengths(ptr: np.ndarray) -> np.ndarray:
    """Entries per row of a CSR (np.diff without its Python-level overhead; this is hot)."""
    return ptr[1:] - ptr[:-1]


def concat_ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)]) without the Python loop."""
    lengths = ends - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
    return offsets + np.arange(total)


def link_csr(flow_ptr: np.ndarray, flow_links: np.ndarray, num_links: int) -> tuple[np.ndarray, np.ndarray]:
    """Transpose a flow -> links CSR into link -> flows: (link_ptr (L+1,), link_flows (P,))."""
    flow_of_pair = np.repeat(np.arange(len(flow_ptr) - 1), row_lengths(flow_ptr))
    keys = flow_links.astype(np.uint16) if num_links <= np.iinfo(np.uint16).max else flow_links
    order = np.argsort(keys, kind="stable")  # radix sort for 16-bit keys
    link_ptr = np.zeros(num_links + 1, dtype=np.int64)
    np.cumsum(np.bincount(flow_links, minlength=num_links), out=link_ptr[1:])
    return link_ptr, flow_of_pair[order]


def max_min_rates(
    flow_ptr: np.ndarray, flow_links: np.ndarray, link_ptr: np.ndarray, link_flows: np.ndarray, capacity_Bps: np.ndarray
) -> np.ndarray:
    """Rates (bytes/s) of flows 0..F-1 given both CSR views of the incidence and link capacities."""
    rates = np.zeros(len(flow_ptr) - 1)
    frozen = np.zeros(len(flow_ptr) - 1, dtype=bool)
    fill(
        flow_ptr,
        flow_links,
        link_ptr,
        link_flows,
        capacity_Bps.astype(float),
        row_lengths(link_ptr).astype(float),
        frozen,
        rates,
    )
    return rates


def fill(
    flow_ptr: np.ndarray,
    flow_links: np.ndarray,
    link_ptr: np.ndarray,
    link_flows: np.ndarray,
    residual: np.ndarray,
    unfrozen_on: np.ndarray,
    frozen: np.ndarray,
    rates: np.ndarray,
) -> None:
    """Progressive filling of the flows not `frozen`, in place: `residual` is what frozen flows
    leave of each link, `unfrozen_on` how many unfrozen flows cross it. Resuming a fill this way
    after flows leave is exact for the flows `rates_that_survive` picks. Only links that still
    carry unfrozen flows are scanned each round, so rounds late in a fill with many distinct
    levels (ECMP collisions make hundreds) stay cheap.
    """
    live = np.flatnonzero(unfrozen_on)
    while len(live):
        share = residual[live] / unfrozen_on[live]
        best = share.min()
        bottleneck = live[share <= best * (1 + TIE)]
        if len(bottleneck) == 1:  # the usual case: one link's flows, already distinct
            candidates = link_flows[link_ptr[bottleneck[0]] : link_ptr[bottleneck[0] + 1]]
            newly = candidates[~frozen[candidates]]
        else:
            candidates = link_flows[concat_ranges(link_ptr[bottleneck], link_ptr[bottleneck + 1])]
            newly = np.unique(candidates[~frozen[candidates]])
        rates[newly] = best
        frozen[newly] = True
        pairs = flow_links[concat_ranges(flow_ptr[newly], flow_ptr[newly + 1])]
        touched, taken = np.unique(pairs, return_counts=True)
        unfrozen_on[touched] -= taken
        residual[touched] = np.maximum(residual[touched] - taken * best, 0.0)
        live = live[unfrozen_on[live] > 0]


def rates_that_survive(rates: np.ndarray, leaving: np.ndarray) -> np.ndarray:
    """Which flows keep their max-min rate when the flows in `leaving` go: those slower than the
    slowest leaver.

    Why: progressive filling freezes a flow at the bottleneck links of its level, and a flow
    crosses no bottleneck below its own rate (it would have frozen there). So every round below
    r_min = min(rate of leavers) has bottlenecks without leavers; removing the leavers only
    raises the other links' shares, and those rounds, with their rates, come out the same.
    Capacity they free goes to flows at r_min and above, which are filled again. The margin
    below r_min keeps ties at r_min on the filled side.
    """
    r_min = rates[leaving].min() if leaving.any() else np.inf
    return (rates < r_min * (1 - 1e-9)) & ~leaving
