"""Where a rank's step goes: compute, exposed communication by kind and by parallelism, bubble; and
all-to-all bus bandwidth.

The step-time breakdown of rank r over [0, T] (T = the step time) gives every instant one owner:
  compute_r          = |union of r's compute spans (F, B, OPT)|
  exposed_r[K]       = |instants r computes nothing while a span of kind K is active on r|, where
                       K is a collective kind (the span's phase in lower case) or "p2p" (SEND/RECV);
                       if several kinds are active at once the first in EXPOSED_KINDS wins
  bubble_r           = T - compute_r - sum_K exposed_r[K]   (no compute, no communication on r)
so compute_r + sum_K exposed_r[K] + bubble_r = T by construction, and so do the means over ranks.
The same exposed time is split a second way, by the parallelism each span serves (GROUP_OF_STREAM:
its op's stream), exposed_by_group_r[G] for G in TP, PP, DP, EP: an exposed instant goes to the
group of the winning kind's spans (the first in GROUPS when spans of several are active), so the
groups' times sum to sum_K exposed_r[K] too.
It is one sweep over the sorted span ends (numpy): 2 million spans take about 2 s, most of it
reading the Span tuples.

A RECV is posted as soon as its stream gets to it and then waits for the producer, so its span
holds the pipeline's wait as well as the transfer. Given `sent_s` (see message_departures), a RECV
counts only from when its message left the sender: waiting for a stage upstream stays bubble, the
message in flight is exposed p2p. A collective counts from when the rank joins it, so waiting for
the group's last member is exposed communication of that kind (as NCCL's kernel time would show it).

This bubble is summary.json's (`bubble_fraction` = bubble_r / T, and `time_breakdown_s`): it counts
the whole step and takes communication out of it, so idle time under a collective is "exposed
communication", not bubble. Megatron's t_pb / t_id (idle over busy forward and backward time in the
pipeline window) is a different figure and keeps its own name (sim.results.metrics).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress
from operator import itemgetter

import numpy as np

from clustersim.schedules.ir import COLLECTIVE_KINDS, COMPUTE_STREAM, PHASES, Collective, Comm, Program, Recv, Send
from clustersim.sim.engine.records import EventLog

# Priority when several kinds are active on an idle rank: the fixed five first, then the
# remaining collective kinds in schedules.ir order (each kept separate).
EXPOSED_KINDS: tuple[str, ...] = ("all_to_all", "all_reduce", "reduce_scatter", "all_gather", "p2p")
EXPOSED_KINDS += tuple(k for k in COLLECTIVE_KINDS if k not in EXPOSED_KINDS)
P2P_PHASES = (Comm.SEND, Comm.RECV)
# The parallelism a communication span serves, by its op's stream (schedules.ir's send, recv and dp
# streams, schedules.tensor_parallel's tp and ep): ZeRO's gathers and reduce-scatters are DP's.
GROUP_OF_STREAM = {"tp": "TP", "send": "PP", "recv": "PP", "dp": "DP", "ep": "EP"}
GROUPS = ("TP", "PP", "DP", "EP")


@dataclass(frozen=True)
class Breakdown:
    """Per-rank seconds (arrays of num_ranks): compute, exposed communication by kind, bubble,
    `in_kind_s[K]` = |union of r's spans of kind K| whether compute hides them or not, and the
    exposed communication by parallelism group (GROUPS, and any other stream's by its name)."""

    step_time_s: float
    compute_s: np.ndarray
    exposed_s: dict[str, np.ndarray]
    bubble_s: np.ndarray
    in_kind_s: dict[str, np.ndarray]
    exposed_by_group_s: dict[str, np.ndarray]

    def means(self) -> dict:
        """Means over ranks; bubble is the remainder, so the identity holds for the means too (up
        to rounding: a remainder a few ulps below 0 is 0, never a negative bubble)."""
        compute, exposed = float(self.compute_s.mean()), {k: float(v.mean()) for k, v in self.exposed_s.items()}
        return {
            "compute_s": compute,
            "bubble_s": max(0.0, self.step_time_s - compute - sum(exposed.values())),
            "exposed_comm_s": exposed,
            "exposed_by_group_s": {k: float(v.mean()) for k, v in self.exposed_by_group_s.items()},
        }


def category_of(phase: str) -> int:
    """0 for compute, 1 + the index in EXPOSED_KINDS for communication; an unknown phase is an error."""
    if phase in PHASES:
        return 0
    kind = "p2p" if phase in P2P_PHASES else phase.lower()
    if kind not in EXPOSED_KINDS:
        raise ValueError(
            f"span phase {phase!r} is neither compute {PHASES}, p2p {P2P_PHASES} nor a collective "
            f"kind in capitals ({', '.join(k.upper() for k in COLLECTIVE_KINDS)})"
        )
    return 1 + EXPOSED_KINDS.index(kind)


SpanKey = tuple[int, str, str]  # (rank, stream, label)


def message_departures(program: Program, log: EventLog) -> dict[SpanKey, float]:
    """RECV span key -> start of the matching SEND span (when the message left its sender); the
    program pairs them: a Recv of tag g from peer p on rank r meets p's Send of g to r."""
    sends = compress(log.spans, map(Comm.SEND.__eq__, map(itemgetter(3), log.spans)))  # the SEND spans
    send_start = {(s.rank, s.stream, s.label): s.start_s for s in sends}
    left: dict[tuple, float] = {}  # (sender, receiver, tag) -> when the message left
    recvs: list[tuple[int, Recv]] = []
    for rank, ops in program.ops.items():  # two quick passes over the ops (millions on a big run)
        for op in [op for op in ops if type(op) is Send]:
            if (start := send_start.get((rank, op.stream, op.label))) is not None:
                left[(rank, op.peer, op.tag)] = start
        recvs += [(rank, op) for op in ops if type(op) is Recv]
    return {
        (rank, op.stream, op.label): start
        for rank, op in recvs
        if (start := left.get((op.peer, rank, op.tag))) is not None
    }


def step_breakdown(
    log: EventLog, step_time_s: float | None = None, sent_s: dict[SpanKey, float] | None = None
) -> Breakdown:
    """The breakdown of the module docstring, by a sweep over every span's start (+1) and end (-1);
    a RECV named in `sent_s` starts at max(its start, sent_s[its key]) (None: RECVs count whole).

    Events sorted by (rank, time) cut each rank's timeline into segments; the running sum of a
    category's +1/-1 says whether it is active on a segment (every span closes on its own rank, so
    the sums return to 0 between ranks and need no reset; the order of events at one instant only
    matters on segments of length 0). A segment belongs to the lowest active category (compute,
    then EXPOSED_KINDS in order, a kind's spans by group in GROUPS order); segment lengths summed
    per rank with bincount give the unions and the exposed times.
    """
    step = log.makespan_s if step_time_s is None else step_time_s
    n, spans, ranks_n = len(log.spans), log.spans, log.num_ranks
    codes = {phase: i for i, phase in enumerate((*PHASES, *Comm))}  # every phase a span can have
    try:
        code = np.fromiter(map(codes.__getitem__, map(itemgetter(3), spans)), np.int64, n)
    except KeyError:  # a phase of no kind: category_of names it
        code = np.fromiter((codes.setdefault(s.phase, len(codes)) for s in spans), np.int64, n)
    category = np.array([category_of(p) for p in codes], dtype=np.int64)[code] if n else code
    group_names = list(GROUPS)  # then any stream outside GROUP_OF_STREAM, by its own name
    group_of = {stream: GROUPS.index(g) for stream, g in GROUP_OF_STREAM.items()}

    def group_code(stream: str) -> int:
        if stream not in group_of:
            group_of[stream] = len(group_names)
            group_names.append(stream)
        return group_of[stream]

    group_code(COMPUTE_STREAM)  # a compute span's group is never read, but every run has them
    try:
        group = np.fromiter(map(group_of.__getitem__, map(itemgetter(1), spans)), np.int64, n)
    except KeyError:  # a stream of no group: named after itself
        group = np.fromiter(map(group_code, map(itemgetter(1), spans)), np.int64, n)
    # compute stays 0; communication of kind k and group g is 1 + k x G + g: kinds in order, then groups
    combined = np.where(category == 0, 0, 1 + (category - 1) * len(group_names) + group)
    rank = np.fromiter(map(itemgetter(0), spans), np.int64, n)
    start = np.fromiter(map(itemgetter(6), spans), float, n)
    if sent_s:
        recvs = np.flatnonzero(code == codes[Comm.RECV]).tolist()
        left = start.copy()
        left[recvs] = [sent_s.get((s.rank, s.stream, s.label), s.start_s) for s in map(spans.__getitem__, recvs)]
        start = np.maximum(start, left)
    start = np.clip(start, 0.0, step)
    end = np.clip(np.fromiter(map(itemgetter(7), spans), float, n), start, step)

    time, rank, combined = np.concatenate([start, end]), np.concatenate([rank, rank]), np.tile(combined, 2)
    delta = np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64)])
    order = np.lexsort((time, rank))  # (2n,) events by rank, then time
    time, rank, combined, delta = time[order], rank[order], combined[order], delta[order]
    seg_rank = rank[:-1]  # (2n - 1,) segment i runs from event i to event i + 1
    seg_s = np.where(rank[1:] == seg_rank, np.diff(time), 0.0)
    ranks = log.averaged_ranks  # a symmetric run's representatives stand for every rank

    def seconds(segments: np.ndarray) -> np.ndarray:
        """Each walked rank's total length of the `segments` (a mask)."""
        return np.bincount(seg_rank[segments], weights=seg_s[segments], minlength=ranks_n)[:ranks_n][ranks]

    width = len(group_names)
    owner = np.full(len(seg_s), -1, dtype=np.int64)
    union = {k: np.zeros(len(ranks)) for k in range(1 + len(EXPOSED_KINDS))}
    present = np.flatnonzero(np.bincount(combined))[::-1].tolist()  # the categories met (no sort of the events)
    met: dict[int, list[int]] = {}  # category (0 compute, 1 + EXPOSED_KINDS index) -> its combined ones met
    for c in present:  # highest first, so kinds come highest first too
        met.setdefault(0 if c == 0 else 1 + (c - 1) // width, []).append(c)
    for kind, cats in met.items():
        in_kind = np.zeros(len(seg_s), dtype=bool)
        for cat in cats:  # lowest last: it wins
            active = np.cumsum(np.where(combined == cat, delta, 0))[:-1] > 0
            in_kind |= active
            owner[active] = cat
        union[kind] = seconds(in_kind)
    # each segment's owning kind and group (-1: compute or nobody); a kind or group no span has owns nothing
    kind_of, group_of_segment = (
        np.where(owner > 0, (owner - 1) // width, -1),
        np.where(owner > 0, (owner - 1) % width, -1),
    )
    kinds, groups = {(c - 1) // width for c in present if c > 0}, {(c - 1) % width for c in present if c > 0}
    nothing = np.zeros(len(ranks), np.int64)  # what seconds() of no segment gives (bincount of nothing: ints)
    exposed = {k: seconds(kind_of == i) if i in kinds else nothing.copy() for i, k in enumerate(EXPOSED_KINDS)}
    by_group = {g: seconds(group_of_segment == i) if i in groups else nothing.copy() for i, g in enumerate(group_names)}
    return Breakdown(
        step,
        union[0],
        exposed,
        np.maximum(0.0, step - union[0] - sum(exposed.values())),  # below 0 only by rounding (ulps)
        {k: union[1 + i] for i, k in enumerate(EXPOSED_KINDS)},
        {g: v for g, v in by_group.items() if g in GROUPS or v.any()},
    )


def alltoall_sizes(program: Program) -> dict[SpanKey, tuple[int, float]]:
    """(rank, stream, label) -> (group size n, S = the bytes the rank sends, nccl-tests' size) of
    every all-to-all op; an uneven all-to-all's nbytes is an (n, n) matrix whose rank row it sends."""
    sizes = {}
    for rank, ops in program.ops.items():
        for op in ops:
            if isinstance(op, Collective) and op.kind == "all_to_all":
                nbytes = np.asarray(op.nbytes, dtype=float)
                sent = float(nbytes[op.group.index(rank)].sum()) if nbytes.ndim == 2 else float(nbytes)
                sizes[(rank, op.stream, op.label)] = (len(op.group), sent)
    return sizes


def alltoall_busbw_GBps(log: EventLog, sizes: dict[SpanKey, tuple[int, float]]) -> float | None:
    """nccl-tests' bus bandwidth of the all-to-alls taken together, sum S x (n - 1) / n over sum t in
    GB/s (1e9 B/s): S a rank's send bytes, n the group size, t the span (from the rank joining to
    the end, so waiting for the last member counts). Summed, not averaged per span, so a few tiny
    exchanges (an MoE layer's expert counts) do not swamp the token traffic. None when there is no
    all-to-all of positive length."""
    moved = seconds = 0.0
    for span in log.spans:
        if span.phase == Comm.ALL_TO_ALL and span.duration_s > 0:
            n, sent = sizes[(span.rank, span.stream, span.label)]
            moved += sent * (n - 1) / n
            seconds += span.duration_s
    return moved / seconds / 1e9 if seconds > 0 else None
