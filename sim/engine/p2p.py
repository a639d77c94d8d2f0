"""The point-to-point handlers: eager sends and receives through a mailbox.

A send waits for its dependencies, then hands its bytes to the network (through the run's Scale)
and finishes when they land; the receiver need not be ready: the message waits in the receiver's
mailbox. A zero-byte send (a signal) takes no bandwidth, so its walker runs ahead: it is recorded
at once with its path latency. A receive finishes when its message is in the mailbox."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

from clustersim.schedules.ir import Comm, Recv, Send
from clustersim.sim.engine.numerics import Numerics
from clustersim.sim.engine.records import Span
from clustersim.sim.engine.walkers import Ends, Pending, Walker, Walkers
from clustersim.sim.scale.execution import Scale

_span = tuple.__new__  # a Span without the NamedTuple's Python-level __new__ (hot path)


class PointToPoint:
    """Sends and receives; the mailbox maps (src rank, dst rank, tag) to (arrival, payload) once
    sent, or to the Pending its receiver waits on."""

    def __init__(self, env: simpy.Environment, walkers: Walkers, scale: Scale, numerics: Numerics | None):
        self.env, self.walkers, self.scale, self.numerics = env, walkers, scale, numerics
        self.mailbox: dict[tuple, Any] = {}
        mailbox, wake = self.mailbox, walkers.wake

        def post(key: tuple, at: float, payload: object) -> None:
            """A message lands at `at`: its receiver, if already waiting, runs next."""
            box = mailbox.get(key)
            if box is None:
                mailbox[key] = (at, payload)
            else:
                box.at, box.value = at, payload
                wake(box)

        self._post = post

    def bind_send(self, walker: Walker) -> Callable[[Send, float], Ends]:
        """The handler of one walker's sends."""
        rank, stream, record, prefix, routes = walker.rank, walker.stream, walker.record, walker.prefix, walker.routes
        numerics, post, transfer = self.numerics, self._post, self._transfer
        signal = self.scale.signal_from(rank)

        def send(op: Send, t: float) -> Ends:
            if op.nbytes > 0:
                return transfer(walker, op, t)
            payload = numerics.send_payload(rank, op) if numerics is not None else None
            end = t + signal(op.peer, t, prefix + op.label + routes[op.peer])
            post((rank, op.peer, op.tag), end, payload)
            record(_span(Span, (rank, stream, op.label, Comm.SEND, op.tag[1], op.tag[2], t, end, 0.0, 0.0)))
            return end

        return send

    def _transfer(self, walker: Walker, op: Send, t: float) -> Generator[Any, Any, float]:
        """Bytes move on SimPy's clock: catch it up first."""
        env, rank = self.env, walker.rank
        if t > env.now:
            yield env.timeout(t - env.now)
        start = env.now
        payload = self.numerics.send_payload(rank, op) if self.numerics is not None else None
        self.walkers.waiting[walker.key] = (op, "in flight")
        yield self.scale.send(rank, op.peer, op.nbytes, walker.prefix + op.label + walker.routes[op.peer])
        self._post((rank, op.peer, op.tag), env.now, payload)
        walker.record(
            _span(
                Span, (rank, walker.stream, op.label, Comm.SEND, op.tag[1], op.tag[2], start, env.now, op.nbytes, 0.0)
            )
        )
        return env.now

    def bind_recv(self, walker: Walker) -> Callable[[Recv, float], float | Pending]:
        """The handler of one walker's receives: a message not sent yet is waited for where its
        sender will post it (the walker parks on that Pending, then asks again)."""
        rank, stream, record, me = walker.rank, walker.stream, walker.record, walker.key
        mailbox, numerics, waiting = self.mailbox, self.numerics, self.walkers.waiting

        def recv(op: Recv, t: float) -> float | Pending:
            key = (op.peer, rank, op.tag)
            letter: Any = mailbox.get(key)  # (arrival, payload), None, or a Pending
            if letter is None:
                box = mailbox[key] = Pending()
                waiting[me] = (op, "message")
                return box
            del mailbox[key]  # read once: its payload need not outlive the receive
            if type(letter) is Pending:  # the one this walker waited on, filled in since
                letter = (letter.at, letter.value)
            end = letter[0] if letter[0] > t else t
            if numerics is not None:
                numerics.receive(rank, op, letter[1])
            record(_span(Span, (rank, stream, op.label, Comm.RECV, op.tag[1], op.tag[2], t, end, op.nbytes, 0.0)))
            return end

        return recv
