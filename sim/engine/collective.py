"""The collective handler: a rendezvous, then the group's algorithm over the network.

A collective starts when the last member that joins in person reaches it (the run's Scale says
how many do), runs as a SimPy process of its own (sim.collectives through the Scale: moved,
moved with its images, or replayed) moving the members' real buffers when numerics are on, and
finishes on every member at once. A collective whose time the Scale knows at once (replayed and
met alone) is recorded on the walker's clock, like a compute op."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

from clustersim.schedules.ir import Collective
from clustersim.sim.collectives.ops import unpack_pieces
from clustersim.sim.engine.numerics import Numerics
from clustersim.sim.engine.records import Span
from clustersim.sim.engine.walkers import Ends, Walker, Walkers
from clustersim.sim.scale.execution import Scale

_span = tuple.__new__  # a Span without the NamedTuple's Python-level __new__ (hot path)


class CollectiveHandler:
    """Runs collectives; `meetings` maps a collective's label (its kind and tag, the same on every
    member; a str, quick to hash) to (inputs so far, its done event)."""

    def __init__(self, env: simpy.Environment, walkers: Walkers, scale: Scale, numerics: Numerics | None):
        self.env, self.walkers, self.scale, self.numerics = env, walkers, scale, numerics
        self.meetings: dict[str, tuple[dict[int, object], simpy.Event]] = {}

    def bind(self, walker: Walker) -> Callable[[Collective, float], Ends]:
        """The handler of one walker's collectives."""
        rank, stream, record, prefix = walker.rank, walker.stream, walker.record, walker.prefix
        ahead, replay, meet = self.scale.ahead, self.scale.network.replay, self._meet

        def run(op: Collective, t: float) -> Ends:
            recording = ahead(op)
            if recording is None:
                return meet(walker, op, t)
            end = t + recording.duration_s
            replay(recording, t, prefix + op.label)
            record(_span(Span, (rank, stream, op.label, op.comm, None, None, t, end, op.nbytes, 0.0)))
            return end

        return run

    def _meet(self, walker: Walker, op: Collective, t: float) -> Generator[Any, Any, float]:
        """Join on SimPy's clock (caught up first); done when the group's process ends."""
        env = self.env
        if t > env.now:
            yield env.timeout(t - env.now)
        start = env.now
        self.walkers.waiting[walker.key] = (op, "group")
        outputs = yield self._join(walker.rank, op)
        if self.numerics is not None:
            self.numerics.collective_output(walker.rank, op, outputs[walker.rank])
        walker.record(
            _span(Span, (walker.rank, walker.stream, op.label, op.comm, None, None, start, env.now, op.nbytes, 0.0))
        )
        return env.now

    def _join(self, rank: int, op: Collective) -> simpy.Event:
        """Join the collective `op.tag`; the last member to arrive starts it."""
        inputs, done = self.meetings.setdefault(op.label, ({}, self.env.event()))
        inputs[rank] = self.numerics.collective_input(rank, op) if self.numerics is not None else None
        if len(inputs) == self.scale.in_person(op):  # all in: the meeting (and its buffers) is the group's now
            del self.meetings[op.label]
            self.env.process(self._run_group(op, inputs, done))
        return done

    def _run_group(self, op: Collective, inputs: dict[int, object], done: simpy.Event) -> Generator[Any, Any, None]:
        if self.numerics is not None:
            buffers, counts, nbytes = unpack_pieces([inputs[r] for r in op.group], op.nbytes)
        else:
            buffers, counts, nbytes = None, None, op.nbytes
        outputs = yield from self.scale.collective(op, buffers, nbytes, counts, f"{op.stream}:{op.label}")
        done.succeed(dict(zip(op.group, outputs)) if outputs is not None else {})
