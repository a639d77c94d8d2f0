"""What every collective algorithm produces: a sequence of synchronous steps over a plan.

A **step** is the set of messages a group sends at once (arrays `src`, `dst`, `nbytes`, local
ranks 0..n-1 and real-size bytes) plus `apply(work, ufunc)`, which performs the step's data
movement on the per-rank work buffers after every message has landed. The runner starts the
messages with one `network.transfer_many`, waits for all of them, then calls `apply`: a step
costs the slowest of its messages, and the next step starts only then (lockstep, as in the
alpha-beta model: a step of messages of m bytes costs alpha + m / B when they share no link).

Timing and data are two scales of the same collective. Times use the real byte counts (`Plan.nbytes`,
nccl-tests' meaning of size); data uses small numpy buffers. The mapping is by fraction: a message
carrying k of the K equal pieces of the real buffer moves the same k pieces of the small buffer,
where the small buffer is cut into K pieces the way numpy.array_split cuts it (the first L mod K
pieces one element longer, as NCCL spreads a remainder), so any small length works.

Messages snapshot their payload before any write of the same step: they are concurrent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from clustersim.sim.collectives.nccl import Tuned

Selection = slice | np.ndarray  # elements of one rank's 1-D work buffer


class CollectiveError(ValueError):
    """A collective that cannot run as asked (unknown name, wrong group or buffers for the algorithm)."""


@dataclass(frozen=True)
class Step:
    """Messages sent together: local ranks src[i] -> dst[i], nbytes[i] real bytes each; `apply`
    moves/reduces the small buffers once all have landed. `latency_s`: a step of the NCCL layer
    takes at least this long from start to last landing (its protocol's per-hop latency)."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    apply: Callable[[list[np.ndarray], np.ufunc], None]
    latency_s: float = 0.0


@dataclass
class StepBuilder:
    """Collects the messages of one step; `send` one at a time, then `build` the Step."""

    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    nbytes: list[float] = field(default_factory=list)
    moves: list[tuple[int, Selection, int, Selection, bool]] = field(default_factory=list)

    def send(
        self, src: int, dst: int, nbytes: float, sel: Selection, dst_sel: Selection | None = None, reduce: bool = False
    ) -> None:
        """src's elements `sel` go to dst's elements `dst_sel` (default: the same positions),
        replacing them, or combined with them by the reduction when `reduce`. A message to
        oneself is a local copy: no network traffic."""
        if src != dst:
            self.src.append(src)
            self.dst.append(dst)
            self.nbytes.append(float(nbytes))
        self.moves.append((src, sel, dst, sel if dst_sel is None else dst_sel, reduce))

    def build(self) -> Step:
        moves = self.moves

        def apply(work: list[np.ndarray], ufunc: np.ufunc) -> None:
            payloads = [work[s][sel].copy() for s, sel, _, _, _ in moves]  # concurrent: read all first
            for (_, _, d, dsel, reduce), data in zip(moves, payloads):
                work[d][dsel] = ufunc(work[d][dsel], data) if reduce else data

        return Step(
            np.array(self.src, dtype=np.int64),
            np.array(self.dst, dtype=np.int64),
            np.array(self.nbytes, dtype=float),
            apply,
        )


@dataclass(frozen=True)
class Plan:
    """Everything an algorithm reads: group size, real size, and where each rank's chunk sits in
    the small work buffers.

    `bounds` (n+1,) are element offsets of the n rank chunks (rank r's chunk is
    bounds[r]:bounds[r+1]); every rank's work buffer has bounds[-1] elements, except in
    all_to_all, which uses `send_off`/`recv_off` (n, n): where piece i -> j starts in rank i's and
    in rank j's buffer, `counts` (n, n) its length and `pair_bytes` (n, n) its real size.
    `nodes` lists the local ranks of each node (hierarchical), `dims` the torus shape (torus),
    `nccl` the NCCL layer's decisions for this call (its algorithms only).
    """

    n: int
    nbytes: float
    bounds: np.ndarray
    root: int = 0
    nodes: tuple[tuple[int, ...], ...] | None = None
    dims: tuple[int, ...] | None = None
    counts: np.ndarray | None = None
    send_off: np.ndarray | None = None
    recv_off: np.ndarray | None = None
    pair_bytes: np.ndarray | None = None
    nccl: Tuned | None = None

    @property
    def length(self) -> int:
        return int(self.bounds[-1])

    def pieces(self, k: int) -> list[tuple[slice, float]]:
        """The buffer as k equal pieces: (elements, real bytes = nbytes / k) each.

        When n divides k every rank chunk is cut into k/n pieces (so piece r*k/n + j lies in rank
        r's chunk, even for uneven chunks); otherwise the whole buffer is cut like array_split.
        """
        if k % self.n == 0:
            per = k // self.n
            starts = [lo + split_bounds(hi - lo, per)[:-1] for lo, hi in zip(self.bounds[:-1], self.bounds[1:])]
            edges = np.concatenate(starts + [self.bounds[-1:]])
        else:
            edges = split_bounds(self.length, k)
        share = self.nbytes / k
        return [(slice(int(a), int(b)), share) for a, b in zip(edges[:-1], edges[1:])]

    def chunk(self, rank: int) -> slice:
        """Rank `rank`'s chunk of the buffer."""
        return slice(int(self.bounds[rank]), int(self.bounds[rank + 1]))


def split_bounds(length: int, k: int) -> np.ndarray:
    """Offsets (k+1,) cutting `length` elements into k pieces like numpy.array_split."""
    base, extra = divmod(int(length), k)
    sizes = np.full(k, base, dtype=np.int64)
    sizes[:extra] += 1
    return np.concatenate([[0], np.cumsum(sizes)])


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def require(condition: bool, message: str) -> None:
    if not condition:
        raise CollectiveError(message)
