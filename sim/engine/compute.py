"""The compute handler: a compute op holds its stream for its cost-model time, on the walker's clock.

With numerics the op also runs on its rank's real arrays, and its time is scaled by how much more
or less work it turned out to be than the cost model's even share (an MoE experts piece: the rows
its routing really sent)."""

from __future__ import annotations

from collections.abc import Callable

from clustersim.schedules.ir import Compute
from clustersim.sim.engine.numerics import Numerics
from clustersim.sim.engine.records import Span
from clustersim.sim.engine.walkers import Walker

_span = tuple.__new__  # a Span without the NamedTuple's Python-level __new__ (hot path)


class ComputeHandler:
    """Runs compute ops; never waits (its time is known at once)."""

    def __init__(self, compute_time_s: Callable[[Compute], float], numerics: Numerics | None):
        self.compute_time_s, self.numerics = compute_time_s, numerics

    def bind(self, walker: Walker) -> Callable[[Compute, float], float]:
        """The handler of one walker's compute ops: (op, start) -> end."""
        rank, stream, record = walker.rank, walker.stream, walker.record
        cost, numerics = self.compute_time_s, self.numerics

        def run(op: Compute, t: float) -> float:
            if numerics is None:
                end = t + cost(op)
            else:
                numerics.run_compute(rank, op)
                end = t + cost(op) * numerics.work(rank, op)
            record(_span(Span, (rank, stream, op.label, op.phase, op.microbatch, op.stage, t, end, 0.0, op.flops)))
            return end

        return run
