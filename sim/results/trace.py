"""Chrome trace (Perfetto, chrome://tracing) JSON of an EventLog, a pure function of the record.

Mapping:
    rank r            -> process pid = r + 1, named "rank r" (sorted by rank)
    stream            -> thread, tid = stream_tids(log)[stream] (compute 1, send 2, recv 3, others after)
    Span              -> one complete event ph "X": name = label, cat = phase, ts/dur in microseconds,
                         args {microbatch, stage, bytes, flops}
    network           -> process pid = num_ranks + 1, named "network"
    FlowSpan on link  -> one "X" event per link of its route, on that link's thread (named
                         log.link_names[link]); flows that overlap on one link go to extra lanes
                         "<link> #2", ... because "X" events on one thread must nest.

On top of these, arrows from sends to receives and counter tracks of memory and link utilisation
(sim.results.trace_overlays).

Ids start at 1, not 0: Perfetto treats pid 0 as the kernel's idle process and has merged tid 0 with
tid 1 (google/perfetto#394, thoren-d/tracing-chrome#32). Open the file at https://ui.perfetto.dev.
The output is deterministic: events in a fixed order.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Iterable
from json.encoder import encode_basestring_ascii as quote  # json.dumps of a str, as C
from pathlib import Path

from clustersim.schedules.ir import Program
from clustersim.sim.engine.records import EventLog
from clustersim.sim.network.records import FlowSpan, LinkStats
from clustersim.sim.results.memory import MemoryTimeline
from clustersim.sim.results.trace_overlays import link_counters, memory_counters, p2p_arrows

US_PER_S = 1e6
STREAM_ORDER = ("compute", "send", "recv")  # then any other stream, by name


def rank_pid(rank: int) -> int:
    """The trace process id of a rank (ids start at 1, see the module docstring)."""
    return rank + 1


def stream_tids(log: EventLog) -> dict[str, int]:
    """stream name -> thread id (from 1), the same on every rank: compute, send, recv, then others by name."""
    names = {s.stream for s in log.spans}
    ordered = [s for s in STREAM_ORDER if s in names] + sorted(names - set(STREAM_ORDER))
    return {name: tid for tid, name in enumerate(ordered, start=1)}


def link_lanes(flows: Iterable[FlowSpan]) -> dict[tuple[int, int], int]:
    """(flow index, link) -> lane on that link, packing flows greedily so one lane never overlaps."""
    per_link: dict[int, list[tuple[float, float, int]]] = {}
    for i, flow in enumerate(flows):
        for link in flow.links:
            per_link.setdefault(link, []).append((flow.start_s, flow.end_s, i))
    lanes = {}
    for link, items in per_link.items():
        lane_ends: list[float] = []  # end time of the last flow placed in each lane
        for start, end, i in sorted(items):
            lane = next((k for k, e in enumerate(lane_ends) if e <= start), len(lane_ends))
            if lane == len(lane_ends):
                lane_ends.append(end)
            lane_ends[lane] = end
            lanes[(i, link)] = lane
    return lanes


def _meta(pid: int, tid: int, name: str, value) -> str:
    key = "sort_index" if name.endswith("sort_index") else "name"
    return _compact({"args": {key: value}, "name": name, "ph": "M", "pid": pid, "tid": tid})


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)


def _number(value) -> str:
    """A number (or None) exactly as json.dumps writes it: float.__repr__ for a finite float (numpy
    floats included), str for an int; anything else goes through json.dumps itself."""
    if value is None:
        return "null"
    if type(value) is int:
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return float.__repr__(value)
    return json.dumps(value, allow_nan=False)


def trace_text(
    log: EventLog,
    ranks: list[int] | None = None,
    program: Program | None = None,
    memory: MemoryTimeline | None = None,
    links: LinkStats | None = None,
) -> str:
    """The trace as compact JSON text, {"displayTimeUnit": "ms", "traceEvents": [...]} with every
    object's keys in sorted order (see module docstring). `ranks`: only these ranks' spans (a big
    run's trace would be too large to open), the network process's name saying how many were
    left out. Each event's text is formatted directly (the same bytes json.dumps would write), so
    a trace of millions of events needs no dict per event and no encoder pass over them. Given
    `program`, `memory` or `links`, the overlays of sim.results.trace_overlays: send -> receive
    arrows, memory counters per rank, utilisation counters of the hottest links."""
    meta, events = _rank_events(log, ranks)
    net_meta, net_events = _network_events(log)
    kept = set(range(log.num_ranks) if ranks is None else ranks)
    if program is not None:
        events += p2p_arrows(program, log, kept, rank_pid, stream_tids(log))
    if memory is not None:
        events += memory_counters(memory, kept, rank_pid)
    if links is not None and net_meta:
        net_events += link_counters(links, rank_pid(log.num_ranks))
    ordered = sorted(events + net_events, key=_EVENT_ORDER)  # stable: ties keep ranks' events first
    texts = meta + net_meta + [text for *_, text in ordered]
    return '{"displayTimeUnit":"ms","traceEvents":[' + ",".join(texts) + "]}"


def chrome_trace(log: EventLog, ranks: list[int] | None = None, **overlays) -> dict:
    """The trace as a dict (what `trace_text` writes, read back)."""
    return json.loads(trace_text(log, ranks, **overlays))


Event = tuple[int, int, float, str, str]  # (pid, tid, ts, name, JSON text): sorted on the first four
_EVENT_ORDER = operator.itemgetter(0, 1, 2, 3)


def _rank_events(log: EventLog, ranks: list[int] | None) -> tuple[list[str], list[Event]]:
    """Metadata and one "X" event per span: a process per rank, a thread per stream."""
    tids = stream_tids(log)
    kept = set(range(log.num_ranks) if ranks is None else ranks)
    spans = [s for s in log.spans if s.rank in kept] if ranks is not None else log.spans
    meta: list[str] = []
    for rank in sorted(kept):
        pid = rank_pid(rank)
        meta += [_meta(pid, 0, "process_name", f"rank {rank}"), _meta(pid, 0, "process_sort_index", rank)]
    if len(kept) < log.num_ranks:
        pid = rank_pid(log.num_ranks) + 1
        meta += [
            _meta(
                pid,
                0,
                "process_name",
                f"{log.num_ranks - len(kept)} other ranks left out (over "
                f"{MAX_SPAN_EVENTS} spans; the Gantt shows the same ranks)",
            )
        ]
    for rank, stream in sorted({(s.rank, s.stream) for s in spans}, key=lambda rs: (rs[0], tids[rs[1]])):
        pid, tid = rank_pid(rank), tids[stream]
        meta += [_meta(pid, tid, "thread_name", stream), _meta(pid, tid, "thread_sort_index", tid)]
    quoted: dict[str, str] = {}  # phase -> its JSON string
    fmt = float.__repr__  # what json.dumps writes for a finite float; ts and dur always are
    events = []
    for span in spans:
        pid, tid, ts, mb, stage = (
            rank_pid(span.rank),
            tids[span.stream],
            span.start_s * US_PER_S,
            span.microbatch,
            span.stage,
        )
        cat = quoted.get(span.phase) or quoted.setdefault(span.phase, json.dumps(str(span.phase)))
        text = (
            f'{{"args":{{"bytes":{_number(span.nbytes)},"flops":{_number(span.flops)},'
            f'"microbatch":{"null" if mb is None else mb},"stage":{"null" if stage is None else stage}}},'
            f'"cat":{cat},"dur":{fmt(span.duration_s * US_PER_S)},"name":{quote(span.label)},"ph":"X",'
            f'"pid":{pid},"tid":{tid},"ts":{fmt(ts)}}}'
        )
        events.append((pid, tid, ts, span.label, text))
    return meta, events


MAX_SPAN_EVENTS = 500_000  # beyond this a run's trace keeps the Gantt's ranks only (see sim.report)
MAX_FLOW_EVENTS = 200_000  # beyond this the network lanes would swamp the trace (and Perfetto)


def _network_events(log: EventLog) -> tuple[list[str], list[Event]]:
    """Metadata and one "X" event per (flow, link on its route): one process, a thread per link
    lane. A run with more than MAX_FLOW_EVENTS of them leaves the network out and names the
    process so: links.png and summary.json still describe the links."""
    if not log.flows:
        return [], []
    if len(log.flows.links) > MAX_FLOW_EVENTS:
        net = rank_pid(log.num_ranks)
        return [
            _meta(
                net,
                0,
                "process_name",
                f"network: {len(log.flows)} flows left out (over {MAX_FLOW_EVENTS} flow x link events; see links.png)",
            )
        ], []
    net = rank_pid(log.num_ranks)
    lanes = link_lanes(log.flows)
    used = sorted({(link, lane) for (_, link), lane in lanes.items()})
    flow_tid = {key: tid for tid, key in enumerate(used, start=1)}  # (link, lane) -> tid
    meta = [_meta(net, 0, "process_name", "network"), _meta(net, 0, "process_sort_index", log.num_ranks)]
    for (link, lane), tid in flow_tid.items():
        name = log.link_names[link] if link < len(log.link_names) else f"link {link}"
        name += f" #{lane + 1}" if lane else ""
        meta += [_meta(net, tid, "thread_name", name), _meta(net, tid, "thread_sort_index", tid)]
    events = []
    for i, flow in enumerate(log.flows):
        ts = flow.start_s * US_PER_S
        head = (
            f'{{"args":{{"bytes":{_number(flow.nbytes)},"dst":{_number(flow.dst)},'
            f'"route":[{",".join(map(_number, flow.links))}],"src":{_number(flow.src)}}},"cat":"flow",'
            f'"dur":{_number((flow.end_s - flow.start_s) * US_PER_S)},"name":{quote(flow.label)},"ph":"X",'
            f'"pid":{net},"tid":'
        )
        for link in flow.links:
            tid = flow_tid[(link, lanes[(i, link)])]
            events.append((net, tid, ts, flow.label, f'{head}{tid},"ts":{_number(ts)}}}'))
    return meta, events


def write_trace(log: EventLog, path: str | Path, ranks: list[int] | None = None, **overlays) -> None:
    """Write `trace_text(log, ranks, **overlays)`, one line."""
    Path(path).write_text(trace_text(log, ranks, **overlays) + "\n")
