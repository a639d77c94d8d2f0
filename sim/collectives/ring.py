"""Ring algorithms: reduce-scatter and all-gather around a ring, and pipelined chains.

Costs use the alpha-beta model: alpha = one neighbour path latency, B = one neighbour link's
bandwidth per direction, M = the collective's size in nccl-tests' meaning, n = ranks.

Ring reduce-scatter (n-1 steps): the buffer is cut into n pieces, one owned by each rank. In step
s = 0..n-2, rank i sends piece (i-s-1) mod n to rank i+1, which adds it to its own copy; after
the last step rank i holds piece i summed over all ranks.  Cost (n-1)(alpha + M/(nB)).

Ring all-gather (n-1 steps): rank i starts with piece i; in step s it forwards piece (i-s) mod n
to rank i+1.  Cost (n-1)(alpha + M/(nB)).

Ring all-reduce = ring reduce-scatter then ring all-gather on the same pieces:
2(n-1) steps, cost 2(n-1)alpha + 2(n-1)/n M/B, so busbw = algbw x 2(n-1)/n tends to B.

Bidirectional ring: half of every piece goes clockwise, the other half counter-clockwise, at the
same time. Each step then sends two messages of M/(2n) per rank, one to each neighbour: cost
2(n-1)(alpha + M/(2nB)) for all-reduce where the two directions use distinct links (a ring or
torus fabric); no gain on a single switch, where both leave through the same GPU uplink.

Pipelined chain (broadcast, reduce; NCCL's "ring" for these): ranks form a chain from the root
(or towards it); the buffer is cut into S slices that follow each other down the chain, one hop
per step: n-2+S steps of M/S, cost (n-2+S)(alpha + M/(SB)), which tends to M/B (busbw -> B) as
S grows. S = clip(M / SLICE_BYTES, 1, MAX_SLICES).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from clustersim.sim.collectives.steps import Plan, Selection, Step, StepBuilder

Piece = tuple[Selection, float]  # (elements in the small buffer, real bytes)
PieceTable = Sequence[Sequence[Piece]]  # ring k's position i's piece is pieces[k][i] (read only, so covariant)

SLICE_BYTES = 512 << 10  # pipelined chains cut the buffer into slices of 512 KiB (NCCL's default
# 4 MiB buffer in 8 steps) ...
MAX_SLICES = 256  # ... but no more than this many (each slice is one more step)


def ring_reduce_scatter(rings: list[list[int]], pieces: PieceTable) -> Iterator[Step]:
    """Concurrent rings of equal length d; ring k's position i ends holding pieces[k][i] reduced.
    Step s: position i sends pieces[k][(i-s-1) mod d] to position i+1 (reduce)."""
    d = len(rings[0]) if rings else 0
    for s in range(d - 1):
        step = StepBuilder()
        for ring, own in zip(rings, pieces, strict=True):
            for i in range(d):
                sel, nbytes = own[(i - s - 1) % d]
                step.send(ring[i], ring[(i + 1) % d], nbytes, sel, reduce=True)
        yield step.build()


def ring_all_gather(rings: list[list[int]], pieces: PieceTable) -> Iterator[Step]:
    """Concurrent rings; ring k's position i starts with pieces[k][i] and ends with all of them.
    Step s: position i sends pieces[k][(i-s) mod d] to position i+1 (copy)."""
    d = len(rings[0]) if rings else 0
    for s in range(d - 1):
        step = StepBuilder()
        for ring, own in zip(rings, pieces, strict=True):
            for i in range(d):
                sel, nbytes = own[(i - s) % d]
                step.send(ring[i], ring[(i + 1) % d], nbytes, sel)
        yield step.build()


def _one_ring(plan: Plan) -> tuple[list[list[int]], PieceTable]:
    """The ring 0 -> 1 -> ... -> n-1 -> 0; rank r owns piece r (its chunk)."""
    return [list(range(plan.n))], [plan.pieces(plan.n)]


def _two_rings(plan: Plan) -> tuple[list[list[int]], PieceTable]:
    """Clockwise 0 -> 1 -> ... and counter-clockwise 0 -> n-1 -> ...; rank r's chunk is cut in two
    halves (pieces 2r and 2r+1 of 2n), the first travels clockwise, the second counter-clockwise."""
    n = plan.n
    halves = plan.pieces(2 * n)
    forward = list(range(n))
    backward = [(-i) % n for i in range(n)]
    return [forward, backward], [[halves[2 * r] for r in forward], [halves[2 * r + 1] for r in backward]]


def all_reduce(plan: Plan) -> Iterator[Step]:
    rings, pieces = _one_ring(plan)
    yield from ring_reduce_scatter(rings, pieces)
    yield from ring_all_gather(rings, pieces)


def all_reduce_bidir(plan: Plan) -> Iterator[Step]:
    rings, pieces = _two_rings(plan)
    yield from ring_reduce_scatter(rings, pieces)
    yield from ring_all_gather(rings, pieces)


def reduce_scatter(plan: Plan) -> Iterator[Step]:
    yield from ring_reduce_scatter(*_one_ring(plan))


def reduce_scatter_bidir(plan: Plan) -> Iterator[Step]:
    yield from ring_reduce_scatter(*_two_rings(plan))


def all_gather(plan: Plan) -> Iterator[Step]:
    yield from ring_all_gather(*_one_ring(plan))


def all_gather_bidir(plan: Plan) -> Iterator[Step]:
    yield from ring_all_gather(*_two_rings(plan))


def pipeline_slices(nbytes: float) -> int:
    """How many slices a pipelined chain cuts M bytes into: clip(ceil(M / SLICE_BYTES), 1, MAX_SLICES)."""
    return int(min(MAX_SLICES, max(1, math.ceil(nbytes / SLICE_BYTES))))


def broadcast(plan: Plan) -> Iterator[Step]:
    """Chain root -> root+1 -> ... -> root-1; slice s crosses hop v (v -> v+1) in step s + v."""
    n, slices = plan.n, pipeline_slices(plan.nbytes)
    pieces = plan.pieces(slices)
    rank = [(plan.root + v) % n for v in range(n)]
    for t in range(n - 2 + slices if n > 1 else 0):
        step = StepBuilder()
        for v in range(n - 1):
            if 0 <= t - v < slices:
                sel, nbytes = pieces[t - v]
                step.send(rank[v], rank[v + 1], nbytes, sel)
        yield step.build()


def reduce(plan: Plan) -> Iterator[Step]:
    """Chain root-1 -> root-2 -> ... -> root, adding on the way; slice s crosses hop v -> v-1
    (v counted from the root) in step s + (n-1-v)."""
    n, slices = plan.n, pipeline_slices(plan.nbytes)
    pieces = plan.pieces(slices)
    rank = [(plan.root + v) % n for v in range(n)]
    for t in range(n - 2 + slices if n > 1 else 0):
        step = StepBuilder()
        for v in range(n - 1, 0, -1):
            s = t - (n - 1 - v)
            if 0 <= s < slices:
                sel, nbytes = pieces[s]
                step.send(rank[v], rank[v - 1], nbytes, sel, reduce=True)
        yield step.build()
