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


def max_min_rates(flow_ptr: np.ndarray, flow_links: np.ndarray, link_ptr: np.ndarray, link_flows: np.ndarray,
                  capacity_Bps: np.ndarray) -> np.ndarray:
    """Rates (bytes/s) of flows 0..F-1 given both CSR views of the incidence and link capacities."""
    num_flows, num_links = len(flow_ptr) - 1, len(capacity_Bps)
    rates = np.zeros(num_flows)
    frozen = np.zeros(num_flows, dtype=bool)
    unfrozen_on = row_lengths(link_ptr).astype(float)  # unfrozen flows per link
    residual = capacity_Bps.astype(float)
    share = np.empty(num_links)
    while True:
        used = unfrozen_on > 0
        if not used.any():
            return rates
        share.fill(np.inf)
        np.divide(residual, unfrozen_on, out=share, where=used)
        best = share.min()
        bottleneck = np.flatnonzero(share <= best * (1 + TIE))
        candidates = link_flows[concat_ranges(link_ptr[bottleneck], link_ptr[bottleneck + 1])]
        newly = np.unique(candidates[~frozen[candidates]])
        rates[newly] = best
        frozen[newly] = True
        taken = np.bincount(flow_links[concat_ranges(flow_ptr[newly], flow_ptr[newly + 1])], minlength=num_links)
        unfrozen_on -= taken
        residual -= taken * best
        np.maximum(residual, 0.0, out=residual)
