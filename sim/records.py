"""The event log: the one record of a run. Every report, metric and plot is a function of it.

Spans are NamedTuples: the engine makes one per op, so they must be cheap to build."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
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
class FlowTable:
    """Every delivered message, as columns (a big run moves millions): GPU src/dst, start and
    delivery time, bytes, label (an index into `labels`), route (CSR: links[link_ptr[i]:link_ptr[i+1]]),
    in delivery order. Iterating yields FlowSpans; `FlowTable.of(spans)` builds one from them.
    Past a limit, replayed collectives' and symmetric orbits' messages are only `summed` per
    (src, dst, stream)."""

    src: np.ndarray
    dst: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    nbytes: np.ndarray
    label: np.ndarray
    labels: tuple[str, ...]
    link_ptr: np.ndarray
    links: np.ndarray
    # messages summed rather than listed (a huge run's replayed collectives): src, dst, bytes, label
    summed: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] = field(
        default_factory=lambda: FlowTable.summed_default())

    @staticmethod
    def summed_default() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)

    def totals(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(src, dst, bytes, label) of every message, listed or summed: what byte counts read."""
        src, dst, nbytes, label = self.summed
        return (np.concatenate([self.src, src]), np.concatenate([self.dst, dst]),
                np.concatenate([self.nbytes, nbytes]), np.concatenate([self.label, label]))

    @staticmethod
    def of(spans) -> FlowTable:
        spans = list(spans)
        labels = tuple(dict.fromkeys(f.label for f in spans))
        index = {label: i for i, label in enumerate(labels)}
        ptr = np.zeros(len(spans) + 1, dtype=np.int64)
        np.cumsum([len(f.links) for f in spans], out=ptr[1:])
        column = lambda name, dtype: np.array([getattr(f, name) for f in spans], dtype=dtype)  # noqa: E731
        return FlowTable(column("src", np.int64), column("dst", np.int64), column("start_s", float),
                         column("end_s", float), column("nbytes", float),
                         np.array([index[f.label] for f in spans], dtype=np.int64), labels, ptr,
                         np.array([link for f in spans for link in f.links], dtype=np.int64))

    def __len__(self) -> int:
        return len(self.src)

    def __iter__(self):
        for i in range(len(self.src)):
            yield FlowSpan(int(self.src[i]), int(self.dst[i]),
                           tuple(self.links[self.link_ptr[i]:self.link_ptr[i + 1]].tolist()), float(self.start_s[i]),
                           float(self.end_s[i]), float(self.nbytes[i]), self.labels[int(self.label[i])])


@dataclass(frozen=True)
class LinkStats:
    """Per-link totals of a run (arrays indexed by link id) and the load timeline.

    utilisation_l = bytes_l / (bandwidth_l x step time); busy_s_l = time with at least one flow
    on l; peak_flows_l = most flows sharing l at once; timeline = (times, link ids, loads B/s),
    three columns in time order: link l's load became load at time t, and holds until its next entry
    (of the hottest links only, see Network.link_stats).
    """

    names: tuple[str, ...]
    capacity_Bps: np.ndarray
    bytes: np.ndarray
    busy_s: np.ndarray
    utilisation: np.ndarray
    peak_flows: np.ndarray
    timeline: tuple[np.ndarray, np.ndarray, np.ndarray]


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
        return max((s.end_s for s in self.spans), default=0.0)

    @functools.cached_property
    def whole_ops(self) -> dict[tuple[int, str, int, int], tuple[float, float]]:
        """(rank, phase, stage, microbatch) -> (start, end) of each forward and backward, its pieces
        (tensor parallelism cuts an op at its collectives) taken together: first start, last end.
        A stream runs its pieces in order, so the first piece seen starts the op, the last ends it."""
        ops: dict[tuple[int, str, int, int], tuple[float, float]] = {}
        for span in self.spans:
            if span.phase == "F" or span.phase == "B":
                key = (span.rank, span.phase, span.stage, span.microbatch)
                first = ops.get(key)
                ops[key] = (span.start_s if first is None else first[0], span.end_s)
        return ops
