"""The point-to-point handlers: eager sends and receives through a mailbox.

A send waits for its dependencies, then hands its bytes to the network (through the run's Scale)
and finishes when they land; the receiver need not be ready: the message waits in the receiver's
mailbox. A zero-byte send (a signal) takes no bandwidth, so its walker runs ahead: it is recorded
at once with its path latency. A receive finishes when its message is in the mailbox."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from clustersim.schedules.ir import Recv, Send
from clustersim.sim.engine.numerics import Numerics
from clustersim.sim.engine.records import Span
from clustersim.sim.engine.walkers import Pending, Walker, Walkers
from clustersim.sim.scale.execution import Scale

_span = tuple.__new__  # a Span without the NamedTuple's Python-level __new__ (hot path)


class PointToPoint:
    """Sends and receives; the mailbox maps (src rank, dst rank, tag) to (arrival, payload) once
    sent, or to the Pending its receiver waits on."""

    def __init__(self, env: simpy.Environment, walkers: Walkers, scale: Scale, numerics: Numerics | None):
        self.env, self.walkers, self.scale, self.numerics = env, walkers, scale, numerics
        self.mailbox: dict[tuple, Any] = {}

    def send(self, walker: Walker, op: Send, t: float) -> float | Generator[Any, Any, float]:
        if op.nbytes > 0:
            return self._transfer(walker, op, t)
        payload = self.numerics.send_payload(walker.rank, op) if self.numerics is not None else None
        start = t
        t += self.scale.signal(walker.rank, op.peer, t, walker.prefix + op.label + walker.route(op.peer))
        self._post((walker.rank, op.peer, op.tag), t, payload)
        walker.record(
            _span(Span, (walker.rank, walker.stream, op.label, "SEND", op.tag[1], op.tag[2], start, t, 0.0, 0.0))
        )
        return t

    def _transfer(self, walker: Walker, op: Send, t: float) -> Generator[Any, Any, float]:
        """Bytes move on SimPy's clock: catch it up first."""
        env = self.env
        if t > env.now:
            yield env.timeout(t - env.now)
        start = env.now
        payload = self.numerics.send_payload(walker.rank, op) if self.numerics is not None else None
        self.walkers.waiting[walker.key] = (op, "in flight")
        yield self.scale.send(walker.rank, op.peer, op.nbytes, walker.prefix + op.label + walker.route(op.peer))
        self._post((walker.rank, op.peer, op.tag), env.now, payload)
        walker.record(
            _span(
                Span,
                (walker.rank, walker.stream, op.label, "SEND", op.tag[1], op.tag[2], start, env.now, op.nbytes, 0.0),
            )
        )
        return env.now

    def _post(self, key: tuple, at: float, payload: object) -> None:
        """A message lands at `at`: its receiver, if already waiting, runs next."""
        box = self.mailbox.get(key)
        if box is None:
            self.mailbox[key] = (at, payload)
        else:
            box.at, box.value = at, payload
            self.walkers.wake(box)

    def recv(self, walker: Walker, op: Recv, t: float) -> float | Generator[Any, Any, float]:
        key = (op.peer, walker.rank, op.tag)
        letter = self.mailbox.get(key)
        if letter is None:  # not sent yet: wait where its sender will post it
            return self._await(walker, op, t, key)
        return self._receive(walker, op, t, key, letter)

    def _await(self, walker: Walker, op: Recv, t: float, key: tuple) -> Generator[Any, Any, float]:
        box = self.mailbox[key] = Pending()
        self.walkers.waiting[walker.key] = (op, "message")
        yield box
        return self._receive(walker, op, t, key, (box.at, box.value))

    def _receive(self, walker: Walker, op: Recv, t: float, key: tuple, letter: tuple) -> float:
        del self.mailbox[key]  # read once: its payload need not outlive the receive
        start = t
        if letter[0] > t:
            t = letter[0]
        if self.numerics is not None:
            self.numerics.receive(walker.rank, op, letter[1])
        walker.record(
            _span(Span, (walker.rank, walker.stream, op.label, "RECV", op.tag[1], op.tag[2], start, t, op.nbytes, 0.0))
        )
        return t
