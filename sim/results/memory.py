"""Memory per rank over a run: a step function per rank and category, a pure function of the
event log plus the per-rank byte counts the formulas of sim/cost/memory.py give (habit 12: a
view of the record). `memory_of` derives those counts from a scenario's layout."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from clustersim.schedules.data_parallel import DP_STREAM
from clustersim.schedules.ir import PIPELINE_PHASES, Comm, Phase
from clustersim.schedules.tags import ParamGather, parse_tag
from clustersim.sim.engine.records import EventLog
from clustersim.sim.scenario.units import format_bytes

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "other")
STATIC_CATEGORIES = ("weights", "gradients", "optimizer", "other")
GATHER_PHASES = (Comm.ALL_GATHER,)  # the engine records a collective span with its kind in capitals
CONSUMER_PHASES = PIPELINE_PHASES  # compute that uses (and then frees) a gathered buffer


@dataclass(frozen=True, eq=False)
class RankMemory:
    """One rank's memory as a step function: row i of `bytes` (one column per CATEGORIES entry)
    holds from times_s[i] until times_s[i + 1]; the last row repeats at the end of the run."""

    rank: int
    times_s: np.ndarray  # (n,)
    bytes: np.ndarray  # (n, len(CATEGORIES))

    @property
    def total(self) -> np.ndarray:
        """(n,) the sum of the categories at each time point."""
        return self.bytes.sum(axis=1)

    def category(self, name: str) -> np.ndarray:
        """(n,) one category's bytes over time."""
        return self.bytes[:, CATEGORIES.index(name)]

    @property
    def peaks(self) -> dict[str, float]:
        """Peak of each category, and `total`: the peak of the sum over time (which is at most,
        and usually less than, the sum of the category peaks, since they need not coincide)."""
        out = {name: float(self.bytes[:, i].max()) for i, name in enumerate(CATEGORIES)}
        out["total"] = float(self.total.max())
        return out

    @property
    def peak_time_s(self) -> float:
        """When the total first reaches its peak."""
        return float(self.times_s[int(np.argmax(self.total))])


@dataclass(frozen=True, eq=False)
class MemoryTimeline:
    """Every rank's memory over a run (rank r is ranks[r]), from t = 0 to the makespan."""

    ranks: tuple[RankMemory, ...]
    makespan_s: float


def memory_timeline(
    log: EventLog,
    static_bytes: dict[int, dict[str, float]],
    activation_bytes: dict[int, dict[int, float]],
    zero3: bool = False,
    backward_frees: dict[int, dict[int, float]] | None = None,
) -> MemoryTimeline:
    """Memory per rank over time, a pure function of the event log and the byte counts given.

    - static: `static_bytes[rank]` ({weights, gradients, optimizer, other}, e.g. from
      `model_state_bytes`; a missing rank or key is 0) is held from t = 0 to the end.
    - activations: + `activation_bytes[rank][stage]` (what one microbatch keeps on that stage)
      when a forward span "F" of that stage starts on the rank; - the same when the backward "B" of
      the same (microbatch, stage) ends, or its weight gradient "W" where a zero-bubble schedule
      splits one off (EventLog.held_activations), all but `backward_frees[rank][stage]` of them
      (those only B reads, the loss's softmax), which go when that B ends: still an upper bound, B
      frees more. A rank holding several stages (interleaved) has one entry per stage. A forward
      whose backward never ran keeps its bytes to the end.
    - ZeRO-3 gathers (only when `zero3`): + the span's bytes (a unit's weights) into "weights" when
      a span of phase "ALL_GATHER" on the "dp" stream starts, held until the unit's use ends:
      from the piece its tag names (ParamGather.consumer) to the last F or B piece on the rank
      that starts before the next gathered unit's first piece (the end of the rank's last F or B
      piece if none follows). So a rank holds its shard (static) plus the units gathered ahead and
      in use (schedules.zero3).
    - other: 0 unless given in `static_bytes`. The CUDA context, library workspaces, the allocator's
      fragmentation and the transient full-layer activations rebuilt during a recomputed backward are
      not modelled; spans of other
      phases (SEND, RECV, OPT, R, ...) change nothing.

    Changes at the same instant are applied together (a backward ending when a forward starts
    frees its bytes before the next ones count, as in `metrics.peak_inflight_microbatches_per_rank`).
    """
    unknown = {key for per_rank in static_bytes.values() for key in per_rank} - set(STATIC_CATEGORIES)
    if unknown:
        raise ValueError(
            f"static_bytes has unknown categories {sorted(unknown)} (valid: {', '.join(STATIC_CATEGORIES)})"
        )
    makespan = log.makespan_s
    events: list[list[tuple[float, int, float]]] = [[] for _ in range(log.num_ranks)]  # (t, column, delta)
    _activation_events(log, activation_bytes, backward_frees or {}, events)
    if zero3:
        _gather_events(log, events)
    ranks = []
    for rank in range(log.num_ranks):
        static = np.array(
            [static_bytes.get(rank, {}).get(name, 0.0) if name in STATIC_CATEGORIES else 0.0 for name in CATEGORIES],
            dtype=float,
        )
        ranks.append(_step_function(rank, static, events[rank], makespan))
    return MemoryTimeline(tuple(ranks), makespan)


def _activation_events(log: EventLog, activation_bytes, backward_frees, events) -> None:
    column = CATEGORIES.index("activations")
    ops = log.whole_ops
    for (rank, stage, mb), (start, end) in log.held_activations.items():
        try:
            nbytes = float(activation_bytes[rank][stage])
        except KeyError:
            raise ValueError(
                f"activation_bytes has no entry for rank {rank}, stage {stage} (needed by F{mb}@{stage})"
            ) from None
        events[rank].append((start, column, nbytes))
        if end is None:
            continue
        early = float(backward_frees.get(rank, {}).get(stage, 0.0))
        backward = ops.get((rank, Phase.B, stage, mb))
        if early and backward is not None and (rank, Phase.W, stage, mb) in ops:  # a split backward
            events[rank].append((backward[1], column, -early))
            nbytes -= early
        events[rank].append((end, column, -nbytes))


def _gather_events(log: EventLog, events) -> None:
    column = CATEGORIES.index("weights")
    pieces: dict[int, list[tuple[float, float]]] = {}  # rank -> (start, end) of its F/B pieces, in order
    starts: dict[tuple[int, str], float] = {}  # (rank, piece label) -> its start
    for span in log.spans:
        if span.phase in CONSUMER_PHASES:  # a W reads saved activations, not the weights
            pieces.setdefault(span.rank, []).append((span.start_s, span.end_s))
            starts[(span.rank, span.label)] = span.start_s
    gathers = [span for span in log.spans if span.phase in GATHER_PHASES and span.stream == DP_STREAM]
    first: dict[tuple[int, str], float] = {}  # (rank, gather label) -> its unit's first piece's start
    for span in gathers:  # ZeRO-3's, not sequence parallelism's
        tag = parse_tag(span.label.partition(" ")[2])
        if not isinstance(tag, ParamGather) or (span.rank, tag.consumer) not in starts:
            raise ValueError(f"rank {span.rank}, {span.label}: not a ZeRO-3 gather of a piece that ran")
        first[(span.rank, span.label)] = starts[(span.rank, tag.consumer)]
    uses: dict[int, list[float]] = {}  # rank -> sorted starts of its gathered units' first pieces
    for (rank, _), start in first.items():
        uses.setdefault(rank, []).append(start)
    for rank in uses:
        uses[rank].sort()
        pieces[rank].sort()
    for span in gathers:
        rank_pieces, begun = pieces[span.rank], first[(span.rank, span.label)]
        following = uses[span.rank][bisect.bisect_right(uses[span.rank], begun) :]
        until = following[0] if following else np.inf
        last = bisect.bisect_left(rank_pieces, (until, -np.inf)) - 1  # the last piece starting before it
        events[span.rank].append((span.start_s, column, span.nbytes))
        events[span.rank].append((max(rank_pieces[last][1], span.end_s), column, -span.nbytes))


def _step_function(rank: int, static: np.ndarray, rank_events, makespan_s: float) -> RankMemory:
    """Level after every instant at which something changed, starting from `static` at t = 0."""
    times = np.array([0.0] + [t for t, _, _ in rank_events] + [makespan_s])
    deltas = np.zeros((len(times), len(CATEGORIES)))
    deltas[0] = static
    for i, (_, column, delta) in enumerate(rank_events, start=1):
        deltas[i, column] = delta
    unique, inverse = np.unique(times, return_inverse=True)  # same-instant changes merge
    merged = np.zeros((len(unique), len(CATEGORIES)))
    np.add.at(merged, inverse, deltas)
    levels = np.cumsum(merged, axis=0)  # (n, categories)
    levels[np.abs(levels) < 1e-9 * max(1.0, float(np.abs(deltas).max()))] = 0.0  # cancel float residue of +x -x
    return RankMemory(rank, unique, levels)


def memory_peaks(timeline: MemoryTimeline) -> dict[str, dict[str, float]]:
    """summary.json's `memory_peak_bytes_per_rank`: str(rank) -> peak bytes of weights, gradients,
    optimizer, activations, other, and total (the peak of the sum, not the sum of the peaks)."""
    return {str(rank.rank): rank.peaks for rank in timeline.ranks}


def ranks_over_capacity(peaks: dict[str, dict[str, float]], capacity_bytes: float) -> list[int]:
    """Ranks whose total peak exceeds the GPU's memory, in rank order."""
    return sorted(int(rank) for rank, p in peaks.items() if p["total"] > capacity_bytes)


def capacity_message(peaks: dict[str, dict[str, float]], capacity_bytes: float) -> str | None:
    """One line for the terminal (or a --strict-memory error) when some rank does not fit, else None."""
    over = ranks_over_capacity(peaks, capacity_bytes)
    if not over:
        return None
    worst = max(over, key=lambda r: (peaks[str(r)]["total"], -r))
    shown = ", ".join(map(str, over[:8])) + (", ..." if len(over) > 8 else "")
    return (
        f"memory: {len(over)} rank(s) exceed the GPU's {format_bytes(capacity_bytes)} "
        f"(ranks {shown}; worst rank {worst} peaks at {format_bytes(peaks[str(worst)]['total'])})"
    )
