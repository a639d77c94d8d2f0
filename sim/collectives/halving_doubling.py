"""Recursive halving-doubling (Rabenseifner; Thakur, Rabenseifner & Gropp 2005), n a power of two.

The buffer is cut into n chunks, chunk r belonging to rank r. Partners differ in one bit of the
rank, so every step is a pairwise exchange: each rank sends one message and receives one.
With alpha = one path latency, B = one GPU link's bandwidth and M = nccl-tests' size:

Reduce-scatter by recursive halving (log2 n steps): rank r holds a block of n/2^k chunks at step
k = 0..log2(n)-1; with d = n / 2^(k+1) it keeps the half of the block that contains chunk r and
sends the other half to its partner r xor d, which adds it to its own copy. The message halves
each step. Cost log2(n) alpha + (n-1)/n M/B.

All-gather by recursive doubling (log2 n steps): at step k (d = 2^k) rank r sends the aligned
block of d chunks it holds (the one containing chunk r) to r xor d; blocks double each step.
Cost log2(n) alpha + (n-1)/n M/B.

All-reduce = recursive halving then recursive doubling: 2 log2(n) alpha + 2(n-1)/n M/B, the same
bandwidth term as a ring with 2 log2(n) instead of 2(n-1) latencies. The partners are far apart in
the rank order, so on a ring or torus fabric their paths are long and share links.

A group that is not a power of two is refused (use `tree` or `ring`).
"""

from __future__ import annotations

from collections.abc import Iterator

from clustersim.sim.collectives.steps import Plan, Step, StepBuilder, is_power_of_two, require


def _check(plan: Plan) -> None:
    require(
        is_power_of_two(plan.n), f"halving_doubling needs a power-of-two group, got {plan.n} ranks (use tree or ring)"
    )


def _block(plan: Plan, lo: int, hi: int) -> tuple[slice, float]:
    """Chunks lo..hi-1 as (elements, real bytes)."""
    return slice(int(plan.bounds[lo]), int(plan.bounds[hi])), (hi - lo) * plan.nbytes / plan.n


def reduce_scatter(plan: Plan) -> Iterator[Step]:
    _check(plan)
    n = plan.n
    block = [(0, n)] * n  # chunks [lo, hi) each rank is still reducing
    d = n // 2
    while d >= 1:
        step = StepBuilder()
        for r in range(n):
            lo, hi = block[r]
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if r & d == 0 else ((mid, hi), (lo, mid))
            sel, nbytes = _block(plan, *give)
            step.send(r, r ^ d, nbytes, sel, reduce=True)
            block[r] = keep
        yield step.build()
        d //= 2


def all_gather(plan: Plan) -> Iterator[Step]:
    _check(plan)
    n, d = plan.n, 1
    while d < n:
        step = StepBuilder()
        for r in range(n):
            lo = r & ~(d - 1)
            sel, nbytes = _block(plan, lo, lo + d)
            step.send(r, r ^ d, nbytes, sel)
        yield step.build()
        d *= 2


def all_reduce(plan: Plan) -> Iterator[Step]:
    yield from reduce_scatter(plan)
    yield from all_gather(plan)
