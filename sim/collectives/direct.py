"""Direct algorithms: every rank sends each peer its share at once, and lets the fabric share links.

Chunk r of the buffer belongs to rank r. Costs on a single switch (alpha = one path latency, B =
one GPU link's bandwidth, M = nccl-tests' size), where max-min sharing splits a GPU's uplink
evenly between the messages leaving it:

- reduce-scatter, one step: rank r sends chunk j to rank j for every j != r; rank j adds them
  into its chunk. Each uplink carries (n-1)/n M: cost alpha + (n-1)/n M/B.
- all-gather, one step: rank r sends chunk r to every other rank. alpha + (n-1)/n M/B.
- all-reduce = direct reduce-scatter then direct all-gather: 2 alpha + 2(n-1)/n M/B.
- broadcast, one step: the root sends the whole buffer to every rank: alpha + (n-1) M/B.
- reduce, one step: every rank sends its whole buffer to the root: alpha + (n-1) M/B.
- gather / scatter, one step: chunk r goes from rank r to the root / from the root to rank r:
  alpha + (n-1)/n M/B.
- all-to-all, one step: rank i sends piece i->j to rank j for all j at once (piece i->i is a
  local copy). Uniform pieces of M/n: alpha + (n-1)/n M/B, busbw -> B.
- pairwise all-to-all, n-1 steps: in step k = 1..n-1 rank i sends piece i->(i+k) mod n.
  Uniform pieces: (n-1)(alpha + M/(nB)). Uneven pieces: each step lasts as long as its largest.
- p2p (nccl-tests' sendrecv), one step: rank r sends its whole buffer to rank (r+1) mod n; with a
  group [a, b] that is a and b swapping buffers. alpha + M/B.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from clustersim.sim.collectives.steps import CollectiveError, Plan, Step, StepBuilder


def _others(plan: Plan, r: int) -> list[int]:
    return [j for j in range(plan.n) if j != r]


def reduce_scatter(plan: Plan) -> Iterator[Step]:
    step, share = StepBuilder(), plan.nbytes / plan.n
    for r in range(plan.n):
        for j in _others(plan, r):
            step.send(r, j, share, plan.chunk(j), reduce=True)
    yield step.build()


def all_gather(plan: Plan) -> Iterator[Step]:
    step, share = StepBuilder(), plan.nbytes / plan.n
    for r in range(plan.n):
        for j in _others(plan, r):
            step.send(r, j, share, plan.chunk(r))
    yield step.build()


def all_reduce(plan: Plan) -> Iterator[Step]:
    yield from reduce_scatter(plan)
    yield from all_gather(plan)


def broadcast(plan: Plan) -> Iterator[Step]:
    step, whole = StepBuilder(), slice(0, plan.length)
    for j in _others(plan, plan.root):
        step.send(plan.root, j, plan.nbytes, whole)
    yield step.build()


def reduce(plan: Plan) -> Iterator[Step]:
    step, whole = StepBuilder(), slice(0, plan.length)
    for r in _others(plan, plan.root):
        step.send(r, plan.root, plan.nbytes, whole, reduce=True)
    yield step.build()


def gather(plan: Plan) -> Iterator[Step]:
    step, share = StepBuilder(), plan.nbytes / plan.n
    for r in _others(plan, plan.root):
        step.send(r, plan.root, share, plan.chunk(r))
    yield step.build()


def scatter(plan: Plan) -> Iterator[Step]:
    step, share = StepBuilder(), plan.nbytes / plan.n
    for j in _others(plan, plan.root):
        step.send(plan.root, j, share, plan.chunk(j))
    yield step.build()


class _Pieces(NamedTuple):
    """An all_to_all plan's (n, n) tables: piece i -> j's length, offsets and real bytes."""

    counts: np.ndarray
    send_off: np.ndarray
    recv_off: np.ndarray
    pair_bytes: np.ndarray


def _pieces(plan: Plan) -> _Pieces:
    if plan.counts is None or plan.send_off is None or plan.recv_off is None or plan.pair_bytes is None:
        raise CollectiveError("all_to_all: the plan has no piece tables (counts, offsets, bytes): not made by prepare")
    return _Pieces(plan.counts, plan.send_off, plan.recv_off, plan.pair_bytes)


def _piece(step: StepBuilder, pieces: _Pieces, i: int, j: int) -> None:
    """Piece i -> j of an all-to-all: from rank i's send area to rank j's receive area."""
    count = int(pieces.counts[i, j])
    src = slice(int(pieces.send_off[i, j]), int(pieces.send_off[i, j]) + count)
    dst = slice(int(pieces.recv_off[i, j]), int(pieces.recv_off[i, j]) + count)
    step.send(i, j, pieces.pair_bytes[i, j], src, dst)


def all_to_all(plan: Plan) -> Iterator[Step]:
    step, pieces = StepBuilder(), _pieces(plan)
    for i in range(plan.n):
        for j in range(plan.n):
            _piece(step, pieces, i, j)
    yield step.build()


def all_to_all_pairwise(plan: Plan) -> Iterator[Step]:
    n, pieces = plan.n, _pieces(plan)
    for k in range(1, max(n, 2)):
        step = StepBuilder()
        for i in range(n):
            if k == 1:
                _piece(step, pieces, i, i)  # the local copy rides along with the first step
            if n > 1:
                _piece(step, pieces, i, (i + k) % n)
        yield step.build()


def p2p(plan: Plan) -> Iterator[Step]:
    step, whole = StepBuilder(), slice(0, plan.length)
    for r in range(plan.n):
        step.send(r, (r + 1) % plan.n, plan.nbytes, whole)
    yield step.build()
