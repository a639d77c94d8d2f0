"""A big run's replayed and orbit messages summed per stream instead of listed one by one.

Past sim.network.ledger's LISTED_MESSAGES_MAX the flow table keeps the replays of each recording
(sim.scale.shortcut) and the orbits of each members' list (sim.network.orbits) as one row per
message and stream with their bytes summed, labelled by the first one's label. A recording
replayed a million times adds the same bytes a million times: that sum is taken down a column
(`repeated_sum`), the same additions in the same order as one by one, not one numpy call each.
"""

from __future__ import annotations

import numpy as np

REPEAT_ELEMENTS = 1 << 20  # replays x messages added per accumulate call (8 MiB of float64 at most)


def summed_messages(
    replays: list[tuple], orbit_records: list[tuple], labels: list[str]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, bytes, label) summed by one stream over the replays of each recording
    (`replays`: (recording, start, group id, place)) and over the orbits of each members' list
    (`orbit_records`: (members, start, end, bytes, group id)); `labels`: group id -> label."""
    sums: dict[tuple[int, str], list] = {}  # (recording or members, stream) -> [src, dst, bytes, first label]
    stream = [label.split(":", 1)[0] for label in labels]  # by group id
    for r, _, gid, _ in replays:  # first the times each is replayed
        if (entry := sums.get(key := (id(r), stream[gid]))) is None:
            entry = sums[key] = [r.messages[0], r.messages[1], 0, gid, r.messages[4]]
        entry[2] += 1
    for entry in sums.values():  # then its bytes, summed replay by replay
        entry[2] = repeated_sum(entry.pop(), entry[2])
    for members, _, _, nbytes, gid in orbit_records:
        if (entry := sums.get(key := (id(members), stream[gid]))) is None:
            entry = sums[key] = [members[0], members[1], 0.0, gid]
        entry[2] += nbytes
    src, dst, nbytes, label = zip(
        *((s, d, np.broadcast_to(b, s.shape), np.full(len(s), gid)) for s, d, b, gid in sums.values())
    )
    return (
        np.concatenate(src).astype(np.int64),
        np.concatenate(dst).astype(np.int64),
        np.concatenate(nbytes).astype(float),
        np.concatenate(label).astype(np.int64),
    )


def repeated_sum(values: np.ndarray, times: int) -> np.ndarray:
    """`values` added up `times` times, one addition after another from zeros: bit for bit what
    that loop gives (times x values is not), as add.accumulate down a column is sequential. Each
    distinct value's sum is taken once (a collective's messages mostly share one size)."""
    distinct, back = np.unique(values, return_inverse=True)
    total, rows = np.zeros(len(distinct)), max(1, REPEAT_ELEMENTS // max(len(distinct), 1))
    for k in range(0, times, rows):
        block = np.broadcast_to(distinct, (min(rows, times - k), len(distinct)))
        total = np.add.accumulate(np.concatenate([total[None], block]), axis=0)[-1]
    return total[back.reshape(-1)]
