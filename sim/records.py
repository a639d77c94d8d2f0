"""The event log: the one record of a run. Every report, metric and plot is a function of it.

Spans are NamedTuples: the engine makes one per op, so they must be cheap to build."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class Span(NamedTuple):
    """One op on one rank's stream, from when it started to when it finished (seconds).

    `phase` is "F", "B", "OPT" for compute, "SEND"/"RECV" for point-to-point; `microbatch` and
    `stage` are None where they do not apply.
    """

    rank: int
    stream: str
    label: str
    phase: str
    microbatch: int | None
    stage: int | None
    start_s: float
    end_s: float
    nbytes: float = 0.0
    flops: float = 0.0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


class FlowSpan(NamedTuple):
    """One message moved by the network: its route (link ids), when it entered and was delivered."""

    src: int
    dst: int
    links: tuple[int, ...]
    start_s: float
    end_s: float
    nbytes: float
    label: str


@dataclass(frozen=True)
class LinkStats:
    """Per-link totals of a run (arrays indexed by link id) and the load timeline.

    utilisation_l = bytes_l / (bandwidth_l x step time); busy_s_l = time with at least one flow
    on l; peak_flows_l = most flows sharing l at once; timeline = (t, link ids, load B/s) in time
    order: the links whose load changed at t and their new load, holding until they change again.
    """

    names: tuple[str, ...]
    capacity_Bps: np.ndarray
    bytes: np.ndarray
    busy_s: np.ndarray
    utilisation: np.ndarray
    peak_flows: np.ndarray
    timeline: tuple[tuple[float, np.ndarray, np.ndarray], ...]


@dataclass(frozen=True)
class EventLog:
    """Everything a run recorded, in the order ops and flows finished (deterministic: SimPy's
    tie-break makes one program give one order)."""

    spans: tuple[Span, ...]
    flows: tuple[FlowSpan, ...]
    num_ranks: int
    link_names: tuple[str, ...]
    links: LinkStats | None = None

    @property
    def makespan_s(self) -> float:
        return max((s.end_s for s in self.spans), default=0.0)

    def whole_ops(self, phases: tuple[str, ...] = ("F", "B")) -> dict[tuple[int, str, int, int], tuple[float, float]]:
        """(rank, phase, stage, microbatch) -> (start, end) of each forward or backward, its pieces
        (tensor parallelism cuts an op at its collectives) taken together: first start, last end."""
        ops: dict[tuple[int, str, int, int], tuple[float, float]] = {}
        for span in self.spans:
            if span.phase in phases:
                key = (span.rank, span.phase, span.stage, span.microbatch)
                start, end = ops.get(key, (span.start_s, span.end_s))
                ops[key] = (min(start, span.start_s), max(end, span.end_s))
        return ops
