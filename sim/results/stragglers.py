"""Who keeps an expert-parallel group waiting: the last rank to reach each all-to-all.

An all-to-all starts when its last member arrives, so a rank whose experts got more tokens than
the others (a skewed router) reaches every combine late and the whole group waits for it. Its
step does not end later (the group leaves together); its arrivals do, which is what this counts.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from clustersim.schedules.ir import Comm
from clustersim.sim.engine.records import EventLog

TIE_S = 1e-12  # arrivals closer than this count as together: nobody was last


def last_arrivals(log: EventLog) -> dict[int, int]:
    """rank -> how many all-to-alls it reached strictly after every other member of its group."""
    arrivals: defaultdict[str, list[tuple[float, int]]] = defaultdict(list)
    for span in log.spans:
        if span.phase == Comm.ALL_TO_ALL:
            arrivals[span.label].append((span.start_s, span.rank))
    counts: Counter[int] = Counter()
    for members in arrivals.values():
        members.sort()
        if len(members) > 1 and members[-1][0] - members[-2][0] > TIE_S:
            counts[members[-1][1]] += 1
    return dict(sorted(counts.items()))


def straggler_summary(log: EventLog) -> dict:
    """summary.json's view: every rank's count of last arrivals, and the rank most often last
    (None when every all-to-all's members arrived together)."""
    counts = last_arrivals(log)
    return {
        "alltoall_last_arrivals_per_rank": {str(rank): n for rank, n in counts.items()},
        "alltoall_straggler_rank": max(counts, key=lambda rank: (counts[rank], -rank)) if counts else None,
    }
