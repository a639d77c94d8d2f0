"""The event log: the one record of a run. Every report, metric and plot is a function of it.

Spans are NamedTuples: the engine makes one per op, so they must be cheap to build."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from itertools import compress
from operator import itemgetter
from typing import NamedTuple

from clustersim.schedules.ir import Phase, SpanPhase
from clustersim.sim.network.records import FlowTable, LinkStats


class Span(NamedTuple):
    """One op on one rank's stream, from when it started to when it finished (seconds).

    `phase` is a Phase (F, B, OPT, ...) for compute, a Comm for communication (SEND, RECV, or a
    collective's kind in capitals); `microbatch` and `stage` are None where they do not apply.
    """

    rank: int
    stream: str
    label: str
    phase: SpanPhase
    microbatch: int | None
    stage: int | None
    start_s: float
    end_s: float
    nbytes: float = 0.0
    flops: float = 0.0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class EventLog:
    """Everything a run recorded, in the order ops and flows finished (deterministic: SimPy's
    tie-break makes one program give one order)."""

    spans: tuple[Span, ...]
    flows: FlowTable
    num_ranks: int
    link_names: tuple[str, ...]
    links: LinkStats | None = None
    # the ranks whose spans it holds when those stand for all (sim.symmetry): rank averages are theirs
    represented: tuple[int, ...] | None = None

    @property
    def averaged_ranks(self) -> list[int]:
        """The ranks an average over ranks runs over: all, or the representatives of a symmetric run."""
        return list(self.represented) if self.represented is not None else list(range(self.num_ranks))

    def __post_init__(self):
        if not isinstance(self.flows, FlowTable):  # FlowSpans, as a hand-made log gives them
            object.__setattr__(self, "flows", FlowTable.of(self.flows))

    @functools.cached_property
    def makespan_s(self) -> float:
        return max(map(itemgetter(7), self.spans), default=0.0)  # each span's end_s

    @functools.cached_property
    def whole_ops(self) -> dict[tuple[int, SpanPhase, int | None, int | None], tuple[float, float]]:
        """(rank, phase, stage, microbatch) -> (start, end) of each forward, backward and weight
        gradient (W), its pieces (tensor parallelism cuts an op at its collectives) taken together:
        first start, last end. A stream runs its pieces in order, so the first piece seen starts the
        op, the last ends it."""
        ops: dict[tuple[int, SpanPhase, int | None, int | None], tuple[float, float]] = {}
        wanted = {Phase.F, Phase.B, Phase.W}.__contains__
        for rank, _, _, phase, microbatch, stage, start_s, end_s, _, _ in compress(
            self.spans, map(wanted, map(itemgetter(3), self.spans))
        ):
            key = (rank, phase, stage, microbatch)
            first = ops.get(key)
            ops[key] = (start_s if first is None else first[0], end_s)
        return ops

    @functools.cached_property
    def held_activations(self) -> dict[tuple[int, int | None, int | None], tuple[float, float | None]]:
        """(rank, stage, microbatch) -> (start, end) of the activations a forward keeps for its
        backward: from the forward's start to the end of the last op that needs them, the W when
        the backward is split off one (the weight gradient reads the layers' saved inputs), else
        the backward; end None while no backward has run. A B without its forward on the rank is
        an error. This counts the whole forward's activations until W, an upper bound: the input
        gradient B frees some of them (Qi et al. 2023, Table 1)."""
        ops = self.whole_ops
        held: dict[tuple[int, int | None, int | None], tuple[float, float | None]] = {}
        for (rank, phase, stage, mb), (start, _) in ops.items():
            if phase == Phase.F:
                done = ops.get((rank, Phase.W, stage, mb)) or ops.get((rank, Phase.B, stage, mb))
                held[(rank, stage, mb)] = (start, done[1] if done else None)
        for rank, phase, stage, mb in ops:
            if phase != Phase.F and (rank, stage, mb) not in held:
                raise ValueError(
                    f"rank {rank}: {phase}{mb}@{stage} ends but forward F{mb}@{stage} never ran on this rank"
                )
        return held
