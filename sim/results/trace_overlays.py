"""What trace.json shows on top of the spans: arrows from each send to its receive, and counter
tracks of memory per rank and of the hottest links' utilisation. Pure functions of the record.

Chrome trace format (read by Perfetto):
    arrow    -> a flow event pair with one id: "ph":"s" inside the SEND span (at its midpoint), and
                "ph":"f" with "bp":"e" (bind to the enclosing slice) inside the matching RECV span
                (at its midpoint; a receive is posted before its message leaves, so its start would
                point back in time). The program pairs them: rank r's Recv of tag g from peer p
                meets p's Send of g to r.
    counter  -> "ph":"C" events; each key of `args` is one track. Memory: per rank process, GB by
                category (sim.results.memory.CATEGORIES) at every change. Links: on the network
                process, one track per hottest link (LinkStats.timeline), load / capacity at
                every change.
Events are (pid, tid, ts, name, JSON text) tuples, sorted with the spans by sim.results.trace.
"""

from __future__ import annotations

import json

from clustersim.schedules.ir import Comm, Program, Recv, Send
from clustersim.sim.engine.records import EventLog
from clustersim.sim.network.records import LinkStats
from clustersim.sim.results.memory import CATEGORIES, MemoryTimeline

US_PER_S = 1e6
GB = 1e9
Event = tuple[int, int, float, str, str]


def p2p_arrows(program: Program, log: EventLog, kept: set[int], pid_of, tids: dict[str, int]) -> list[Event]:
    """An arrow (flow event pair) from every SEND span to its RECV span, both ranks kept."""
    spans = {(s.rank, s.stream, s.label): s for s in log.spans if s.phase in (Comm.SEND, Comm.RECV) and s.rank in kept}
    receives = {
        (rank, op.peer, op.tag): (rank, op.stream, op.label)
        for rank, ops in program.ops.items()
        if rank in kept
        for op in ops
        if isinstance(op, Recv)
    }
    events: list[Event] = []
    for rank, ops in sorted(program.ops.items()):
        for op in ops if rank in kept else ():
            if not isinstance(op, Send):
                continue
            send, where = spans.get((rank, op.stream, op.label)), receives.get((op.peer, rank, op.tag))
            recv = spans.get(where) if where is not None else None
            if send is None or recv is None:
                continue
            arrow = len(events) // 2 + 1  # ids from 1
            for span, ph in ((send, "s"), (recv, "f")):
                pid, tid, ts = pid_of(span.rank), tids[span.stream], (span.start_s + span.end_s) / 2 * US_PER_S
                event = {"cat": "p2p", "id": arrow, "name": "message", "ph": ph, "pid": pid, "tid": tid, "ts": ts}
                events.append((pid, tid, ts, "message", _compact(event | ({"bp": "e"} if ph == "f" else {}))))
    return events


def memory_counters(memory: MemoryTimeline, kept: set[int], pid_of) -> list[Event]:
    """One counter event per change of a kept rank's memory: GB per category."""
    events: list[Event] = []
    for rank_memory in memory.ranks:
        if rank_memory.rank not in kept:
            continue
        pid = pid_of(rank_memory.rank)
        for t, row in zip(rank_memory.times_s.tolist(), (rank_memory.bytes / GB).tolist()):
            ts = t * US_PER_S
            events.append((pid, 0, ts, "memory (GB)", _counter("memory (GB)", pid, ts, dict(zip(CATEGORIES, row)))))
    return events


def link_counters(stats: LinkStats, pid: int) -> list[Event]:
    """One counter event per load change of each of the hottest links: its utilisation (0..1)."""
    times, links, loads = stats.timeline
    events: list[Event] = []
    for t, link, load in zip(times.tolist(), links.tolist(), loads.tolist()):
        name = f"utilisation {stats.names[link]}"
        ts = t * US_PER_S
        args = {"utilisation": load / float(stats.capacity_Bps[link])}
        events.append((pid, 0, ts, name, _counter(name, pid, ts, args)))
    return events


def _counter(name: str, pid: int, ts: float, args: dict[str, float]) -> str:
    return _compact({"args": args, "name": name, "ph": "C", "pid": pid, "tid": 0, "ts": ts})


def _compact(event: dict) -> str:
    return json.dumps(event, separators=(",", ":"), sort_keys=True, allow_nan=False)
