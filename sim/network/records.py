"""What the network recorded: every message as a flow span, the flow table, per-link statistics.

Flow spans are NamedTuples and the flow table columns: a run can carry millions of them."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


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
        default_factory=lambda: FlowTable.summed_default()
    )

    @staticmethod
    def summed_default() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)

    @functools.cached_property
    def label_streams(self) -> tuple[list[str], np.ndarray]:
        """(the streams, sorted; each label's stream index): a label is "stream:...", the stream
        what precedes its first colon. Worked out once: a summary asks several times, over
        a million labels on a big run."""
        names = [name.partition(":")[0] for name in self.labels]
        streams = sorted(set(names))
        index = {stream: i for i, stream in enumerate(streams)}
        return streams, np.array([index[name] for name in names], dtype=np.int64)

    def totals(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(src, dst, bytes, label) of every message, listed or summed: what byte counts read."""
        src, dst, nbytes, label = self.summed
        return (
            np.concatenate([self.src, src]),
            np.concatenate([self.dst, dst]),
            np.concatenate([self.nbytes, nbytes]),
            np.concatenate([self.label, label]),
        )

    @staticmethod
    def of(spans) -> FlowTable:
        spans = list(spans)
        labels = tuple(dict.fromkeys(f.label for f in spans))
        index = {label: i for i, label in enumerate(labels)}
        ptr = np.zeros(len(spans) + 1, dtype=np.int64)
        np.cumsum([len(f.links) for f in spans], out=ptr[1:])
        column = lambda name, dtype: np.array([getattr(f, name) for f in spans], dtype=dtype)  # noqa: E731
        return FlowTable(
            column("src", np.int64),
            column("dst", np.int64),
            column("start_s", float),
            column("end_s", float),
            column("nbytes", float),
            np.array([index[f.label] for f in spans], dtype=np.int64),
            labels,
            ptr,
            np.array([link for f in spans for link in f.links], dtype=np.int64),
        )

    def __len__(self) -> int:
        return len(self.src)

    def __iter__(self):
        for i in range(len(self.src)):
            yield FlowSpan(
                int(self.src[i]),
                int(self.dst[i]),
                tuple(self.links[self.link_ptr[i] : self.link_ptr[i + 1]].tolist()),
                float(self.start_s[i]),
                float(self.end_s[i]),
                float(self.nbytes[i]),
                self.labels[int(self.label[i])],
            )


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
