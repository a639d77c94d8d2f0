"""Multi-dimensional all-reduce on a torus d_0 x d_1 x ... (n = product): bidirectional ring
phases per axis, on k parts of the buffer at once, each part taking the axes in its own order.

Rank r sits at coordinates numpy.unravel_index(r, dims) (last axis fastest), so the ring along an
axis joins torus neighbours and closes through the wrap-around link.

One part's reduce-scatter phases, axis a in its order: every line of d_a ranks along axis a (the
other coordinates fixed) runs a ring reduce-scatter on the block it still owns, cut into d_a
parts; after the phase each rank owns 1/d_a of its previous block; after the last axis 1/n of the
part, fully reduced. All-gather phases run the same rings in the reverse order. Every ring is
bidirectional: half the part travels towards +1 along the axis, half towards -1, so both
directions of every link carry data.

With k axes longer than 1, the buffer is cut into k parts and part j takes the axes rotated by j
(x y z, y z x, z x y), their steps side by side: in every phase each axis carries one part, so all
2k links of a rank are busy, as TPU-style multi-dimensional all-reduces do; one axis at a time
would leave 2k - 2 of them idle. On a d^k torus (alpha = one hop's latency, B = one link's
bandwidth per direction), each part of M/k bytes costs 2(d - 1) alpha + (n-1)/n M/(k B) and they
run together:

    T = 2 k (d - 1) alpha + (n-1)/n M / (k B)

against 2(n-1)/n M / (2k B) for a ring at the rank's whole injection bandwidth 2kB: the same
bandwidth term. With unequal axes the parts' phases fall out of step and may share an axis for a
while (the network shares it max-min). An axis with d = 2 is one duplex link in topologies.torus,
so both directions' rings share it and that axis moves at B, not 2B.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np

from clustersim.sim.collectives.ring import Piece, ring_all_gather, ring_reduce_scatter
from clustersim.sim.collectives.steps import CollectiveError, Plan, Step, split_bounds


def _lines(dims: tuple[int, ...], axis: int) -> list[list[int]]:
    """Every line of ranks along `axis`, each ordered by its coordinate on that axis."""
    grid = np.arange(math.prod(dims)).reshape(dims)  # (d_0, ..., d_{k-1})
    return np.moveaxis(grid, axis, -1).reshape(-1, dims[axis]).tolist()


def all_reduce(plan: Plan) -> Iterator[Step]:
    dims = plan.dims
    if dims is None or math.prod(dims) != plan.n:
        raise CollectiveError(
            f"torus needs a torus topology and the group to be all its GPUs in index order "
            f"(got {plan.n} ranks, torus axes {dims})"
        )
    axes = [axis for axis, d in enumerate(dims) if d > 1]
    if not axes:
        return
    k, length = len(axes), plan.length
    bounds = split_bounds(length, k)
    parts = [
        _part_steps(plan, dims, axes[j:] + axes[:j], int(bounds[j]), int(bounds[j + 1]), plan.nbytes / k)
        for j in range(k)
    ]
    for steps in itertools.zip_longest(*parts):
        yield _together([step for step in steps if step is not None])


def _part_steps(
    plan: Plan, dims: tuple[int, ...], order: list[int], start: int, stop: int, nbytes: float
) -> list[Step]:
    """Reduce-scatter then all-gather of the buffer elements start..stop-1 (`nbytes` real bytes),
    one bidirectional ring phase per axis in `order`."""
    n = plan.n
    halves = start + split_bounds(stop - start, 2)
    edges = [halves[h] + split_bounds(halves[h + 1] - halves[h], n) for h in (0, 1)]  # each (n+1,)
    share = nbytes / (2 * n)

    def part(half: int, lo: int, hi: int) -> Piece:
        """Chunks lo..hi-1 of one half of the part."""
        return slice(int(edges[half][lo]), int(edges[half][hi])), (hi - lo) * share

    owned = [(0, n)] * n  # block of chunks each rank still reduces (the same in both halves)
    phases: list[tuple[list[list[int]], list[list[Piece]]]] = []
    for axis in order:
        d = dims[axis]
        rings, pieces = [], []
        for line in _lines(dims, axis):
            lo, hi = owned[line[0]]
            size = (hi - lo) // d
            cuts = [(lo + i * size, lo + (i + 1) * size) for i in range(d)]
            backward = [line[(-i) % d] for i in range(d)]
            rings += [line, backward]
            pieces += [[part(0, *cuts[i]) for i in range(d)], [part(1, *cuts[(-i) % d]) for i in range(d)]]
            for i, r in enumerate(line):
                owned[r] = cuts[i]
        phases.append((rings, pieces))
    steps = [step for rings, pieces in phases for step in ring_reduce_scatter(rings, pieces)]
    return steps + [step for rings, pieces in reversed(phases) for step in ring_all_gather(rings, pieces)]


def _together(steps: list[Step]) -> Step:
    """Steps of disjoint parts of the buffer as one step: all their messages at once."""

    def apply(work: list[np.ndarray], ufunc: np.ufunc) -> None:
        for step in steps:
            step.apply(work, ufunc)

    return Step(
        np.concatenate([s.src for s in steps]),
        np.concatenate([s.dst for s in steps]),
        np.concatenate([s.nbytes for s in steps]),
        apply,
    )
