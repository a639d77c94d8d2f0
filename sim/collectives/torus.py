"""Multi-dimensional all-reduce on a torus d_0 x d_1 x ... (n = product): one ring phase per axis.

Rank r sits at coordinates numpy.unravel_index(r, dims) (last axis fastest), so the ring along an
axis joins torus neighbours and closes through the wrap-around link.

Reduce-scatter phases, axis a = 0, 1, ...: every line of d_a ranks along axis a (the other
coordinates fixed) runs a ring reduce-scatter on the block it still owns, cut into d_a parts;
after the phase each rank owns 1/d_a of its previous block. After the last axis rank r owns 1/n
of the buffer, fully reduced. All-gather phases run the same rings in the reverse axis order.

Every ring is bidirectional: the buffer's first half travels towards +1 along each axis, the second
half towards -1, so both directions of every torus link carry data. With alpha = one hop's latency
and B = one link's bandwidth per direction, axis a's block is M_a = M / (d_0 ... d_{a-1}) and its
phases cost 2(d_a - 1)(alpha + M_a / (2 d_a B)); summed (the bandwidth terms telescope):

    T = 2 sum_a (d_a - 1) alpha + (n-1)/n M/B

against 2(n-1) alpha + 2(n-1)/n M/B for one flat ring: sum(d_a - 1) latencies instead of n - 1,
and half the bytes per link. An axis with d_a = 1 is skipped. An axis with d_a = 2 is one duplex
link in topologies.torus, so both rings share it and that axis moves at B, not 2B: its phases
cost 2(alpha + M_a / (2B)).
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from sim.collectives.ring import Piece, ring_all_gather, ring_reduce_scatter
from sim.collectives.steps import Plan, Step, require, split_bounds


def _lines(dims: tuple[int, ...], axis: int) -> list[list[int]]:
    """Every line of ranks along `axis`, each ordered by its coordinate on that axis."""
    grid = np.arange(math.prod(dims)).reshape(dims)  # (d_0, ..., d_{k-1})
    return np.moveaxis(grid, axis, -1).reshape(-1, dims[axis]).tolist()


def all_reduce(plan: Plan) -> Iterator[Step]:
    dims = plan.dims
    require(dims is not None and math.prod(dims) == plan.n,
            f"torus needs a torus topology and the group to be all its GPUs in index order "
            f"(got {plan.n} ranks, torus axes {dims})")
    n = plan.n
    halves = split_bounds(plan.length, 2)
    edges = [halves[h] + split_bounds(halves[h + 1] - halves[h], n) for h in (0, 1)]  # each (n+1,)
    share = plan.nbytes / (2 * n)

    def part(half: int, lo: int, hi: int) -> Piece:
        """Chunks lo..hi-1 of one half of the buffer."""
        return slice(int(edges[half][lo]), int(edges[half][hi])), (hi - lo) * share

    owned = [(0, n)] * n  # block of chunks each rank still reduces (the same in both halves)
    phases: list[tuple[list[list[int]], list[list[Piece]]]] = []
    for axis, d in enumerate(dims):
        if d == 1:
            continue
        rings, pieces = [], []
        for line in _lines(dims, axis):
            lo, hi = owned[line[0]]
            size = (hi - lo) // d
            parts = [(lo + i * size, lo + (i + 1) * size) for i in range(d)]
            backward = [line[(-i) % d] for i in range(d)]
            rings += [line, backward]
            pieces += [[part(0, *parts[i]) for i in range(d)], [part(1, *parts[(-i) % d]) for i in range(d)]]
            for i, r in enumerate(line):
                owned[r] = parts[i]
        phases.append((rings, pieces))

    for rings, pieces in phases:
        yield from ring_reduce_scatter(rings, pieces)
    for rings, pieces in reversed(phases):
        yield from ring_all_gather(rings, pieces)
