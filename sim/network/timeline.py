"""The load timeline of a network's links: each change of a link's load, in time order.

sim.network.ledger keeps the changes as the network made them: (time, flow link, load) with the place
of the batch each was made in among the batches and the replays (sim.scale.shortcut), by flow link (in a symmetric
run a canonical link stands for its orbit, sim.network.orbits). Here they become one time-ordered list:
a flow link's changes copied to every link of its orbit, each replay's recorded changes shifted to
its start, and changes at one instant kept in the order they happened (their places).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from clustersim.sim.network.maxmin import concat_ranges

if TYPE_CHECKING:
    from clustersim.sim.network.ledger import Recording

Timeline = tuple[np.ndarray, np.ndarray, np.ndarray]  # (times, link ids, loads B/s)


def load_timeline(
    changes: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    replays: list[tuple[Recording, float, int, int]],
    canon: np.ndarray | None,
    num_links: int,
    links: np.ndarray | None = None,
) -> Timeline:
    """Every load change in time order, of `links` only when given. `changes`: (times, flow links,
    loads, places); `replays`: (recording, start, group id, place); `canon`: link -> its orbit's
    canonical link (None: every link is its own)."""
    wanted = np.ones(num_links, dtype=bool)
    if links is not None:
        wanted[:] = False
        wanted[links] = True
    pieces = []
    t, link, v, place = changes
    if len(t):
        if canon is None:
            keep = wanted[link]
            pieces.append((t[keep], link[keep], v[keep], place[keep]))
        else:  # each change, once per wanted link of its orbit
            real = np.flatnonzero(wanted)
            canon_of = canon[real]
            if links is not None:  # first the changes of orbits with a wanted link (of millions, a few)
                hit = np.zeros(num_links, dtype=bool)
                hit[canon_of] = True
                keep = hit[link]
                t, link, v, place = t[keep], link[keep], v[keep], place[keep]
            by_canon = real[np.argsort(canon_of, kind="stable")]
            ptr = np.zeros(num_links + 1, dtype=np.int64)
            np.cumsum(np.bincount(canon_of, minlength=num_links), out=ptr[1:])
            rows = np.repeat(np.arange(len(link)), ptr[link + 1] - ptr[link])
            pieces.append((t[rows], by_canon[concat_ranges(ptr[link], ptr[link + 1])], v[rows], place[rows]))
    by_recording: dict[int, tuple[Recording, list[float], list[int]]] = {}  # each recording's replays, at once
    for recording, start_s, _, at_place in replays:
        if (entry := by_recording.get(id(recording))) is None:
            entry = by_recording[id(recording)] = (recording, [], [])
        entry[1].append(start_s)
        entry[2].append(at_place)
    for recording, starts, places in by_recording.values():
        t, link, v = recording.timeline
        keep = wanted[link]
        n, k = len(starts), int(keep.sum())
        pieces.append(
            (
                (np.asarray(starts)[:, None] + t[keep][None, :]).ravel(),
                np.tile(link[keep], n),
                np.tile(v[keep], n),
                np.repeat(places, k),
            )
        )
    if not pieces:
        return np.zeros(0), np.zeros(0, np.int64), np.zeros(0)
    times, ids, loads, order_of = (np.concatenate(column) for column in zip(*pieces))
    order = np.lexsort((order_of, times))  # stable: a batch keeps its own order
    return times[order], ids[order], loads[order]
