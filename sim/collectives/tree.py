"""Binomial trees: latency-bound collectives in ceil(log2 n) steps, for any n.

Ranks are counted from the root: v = (rank - root) mod n. With D = ceil(log2 n), alpha = one
path latency and B = one GPU link's bandwidth (each step below sends at most one message out of
and into each rank, so on a switch no two messages share a link):

Reduce: in step k = 0..D-1 every v with v mod 2^(k+1) = 2^k sends its partial result (the whole
buffer) to v - 2^k, which adds it to its own. Cost D (alpha + M/B).

Broadcast: the same tree backwards: in step k = D-1..0 every v with v mod 2^(k+1) = 0 sends the
buffer to v + 2^k (if < n). Cost D (alpha + M/B).

All-reduce = reduce to rank 0, then broadcast from rank 0 (NCCL's "tree" is a pipelined double
binary tree; this is the textbook binomial one). Cost 2D (alpha + M/B).

Gather: in step k every v with v mod 2^(k+1) = 2^k sends the chunks it has collected, those of
v .. v+2^k-1, to v - 2^k. The message doubles each step: for n a power of two the cost is
D alpha + (n-1)/n M/B (M = the gathered total, nccl-tests' size).

Scatter: gather backwards: in step k = D-1..0 every v with v mod 2^(k+1) = 0 sends the chunks of
v+2^k .. v+2^(k+1)-1 to v + 2^k. Same cost as gather.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from clustersim.sim.collectives.steps import Plan, Selection, Step, StepBuilder


def _depth(n: int) -> int:
    """ceil(log2 n): the number of tree levels."""
    return (n - 1).bit_length()


def _ranks(plan: Plan) -> list[int]:
    """rank of each v: v counted from the root."""
    return [(plan.root + v) % plan.n for v in range(plan.n)]


def _chunks(plan: Plan, ranks: list[int]) -> tuple[Selection, float]:
    """The chunks of `ranks` (elements, real bytes = len(ranks) x M/n); a slice when contiguous."""
    nbytes = len(ranks) * plan.nbytes / plan.n
    if ranks == list(range(ranks[0], ranks[0] + len(ranks))):
        return slice(int(plan.bounds[ranks[0]]), int(plan.bounds[ranks[-1] + 1])), nbytes
    return np.concatenate([np.arange(plan.bounds[r], plan.bounds[r + 1]) for r in ranks]), nbytes


def reduce(plan: Plan) -> Iterator[Step]:
    n, rank, whole = plan.n, _ranks(plan), slice(0, plan.length)
    for k in range(_depth(n)):
        step = StepBuilder()
        for v in range(1 << k, n, 2 << k):
            step.send(rank[v], rank[v - (1 << k)], plan.nbytes, whole, reduce=True)
        yield step.build()


def broadcast(plan: Plan) -> Iterator[Step]:
    n, rank, whole = plan.n, _ranks(plan), slice(0, plan.length)
    for k in reversed(range(_depth(n))):
        step = StepBuilder()
        for v in range(0, n - (1 << k), 2 << k):
            step.send(rank[v], rank[v + (1 << k)], plan.nbytes, whole)
        yield step.build()


def all_reduce(plan: Plan) -> Iterator[Step]:
    yield from reduce(plan)  # plan.root is 0 for all-reduce
    yield from broadcast(plan)


def gather(plan: Plan) -> Iterator[Step]:
    n, rank = plan.n, _ranks(plan)
    for k in range(_depth(n)):
        step = StepBuilder()
        for v in range(1 << k, n, 2 << k):
            sel, nbytes = _chunks(plan, rank[v : min(v + (1 << k), n)])
            step.send(rank[v], rank[v - (1 << k)], nbytes, sel)
        yield step.build()


def scatter(plan: Plan) -> Iterator[Step]:
    n, rank = plan.n, _ranks(plan)
    for k in reversed(range(_depth(n))):
        step = StepBuilder()
        for v in range(0, n - (1 << k), 2 << k):
            sel, nbytes = _chunks(plan, rank[v + (1 << k) : min(v + (2 << k), n)])
            step.send(rank[v], rank[v + (1 << k)], nbytes, sel)
        yield step.build()
