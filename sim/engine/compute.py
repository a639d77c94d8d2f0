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

    def run(self, walker: Walker, op: Compute, t: float) -> float:
        start = t
        if self.numerics is None:
            t += self.compute_time_s(op)
        else:
            self.numerics.run_compute(walker.rank, op)
            t += self.compute_time_s(op) * self.numerics.work(walker.rank, op)
        walker.record(
            _span(
                Span, (walker.rank, walker.stream, op.label, op.phase, op.microbatch, op.stage, start, t, 0.0, op.flops)
            )
        )
        return t
