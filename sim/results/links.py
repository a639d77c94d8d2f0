"""The hottest links of a run and their utilisation over time, from the network's load timeline."""

from __future__ import annotations

import numpy as np

from clustersim.sim.engine.records import EventLog
from clustersim.sim.network.ledger import TIMELINE_LINKS
from clustersim.sim.network.records import LinkStats

TOP_LINKS = TIMELINE_LINKS  # the links whose load timeline a run keeps
TIME_BINS = 200


def utilisation_matrix(stats: LinkStats, links: np.ndarray, step_s: float, bins: int = TIME_BINS) -> np.ndarray:
    """(len(links), bins) mean utilisation of each link in each time bin.

    The timeline holds each link's load (B/s) from the time it changed until its next change; a
    bin's utilisation is the load's integral over the bin (piecewise linear in time, read off at
    the bin edges) / the bin's width / the link's bandwidth.
    """
    edges = np.linspace(0.0, step_s, bins + 1)
    out = np.zeros((len(links), bins))
    times, ids, loads = stats.timeline
    for row, link in enumerate(np.asarray(links).tolist()):
        mine = ids == link
        t, load = np.append(times[mine], max(step_s, times[mine][-1] if mine.any() else 0.0)), loads[mine]
        if not len(load):
            continue
        integral = np.concatenate([[0.0], np.cumsum(load * np.diff(t))])  # at each change, from the first
        at_edges = np.interp(edges, t, integral, left=0.0, right=integral[-1])
        out[row] = np.diff(at_edges) / np.diff(edges) / stats.capacity_Bps[link]
    return out


def hottest_links(stats: LinkStats, count: int = TOP_LINKS) -> np.ndarray:
    """Link ids with the highest utilisation, hottest first (ties by link id)."""
    order = np.lexsort((np.arange(len(stats.utilisation)), -stats.utilisation))
    return order[:count][stats.utilisation[order[:count]] > 0]


def link_stats(log: EventLog) -> LinkStats:
    """The run's per-link statistics: a log a run made has them, one built by hand may not."""
    if log.links is None:
        raise ValueError("the event log has no link statistics (it was not recorded by a run)")
    return log.links


def link_row(stats: LinkStats, link: int) -> dict[str, object]:
    """One link's figures: name, bytes, busy time, utilisation (bytes / (bandwidth x step time)),
    most flows at once (summary.json's hottest links and links.csv's rows)."""
    return {
        "link": stats.names[link],
        "bytes": float(stats.bytes[link]),
        "busy_s": float(stats.busy_s[link]),
        "utilisation": float(stats.utilisation[link]),
        "peak_flows": int(stats.peak_flows[link]),
    }
