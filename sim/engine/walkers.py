"""Walkers: one generator per (rank, stream) running its ops in order, each on its own clock.

A walker touches SimPy only where SimPy's clock matters (transfers and collectives, which first
catch SimPy up to the walker's clock). An op's end time and a message's arrival are stored the
moment they are known: a walker that finds the one it needs just moves its clock; one that comes
first parks on a `Pending` there and is woken when the producer fills it in, then resumed at
once (the order is sim.engine.loop's tie-break rule; the walkers woken are a list without
times, no second event queue beside SimPy's). So a pipeline's many small waits cost a dict
look-up, or a list append and a generator resume, not an event through SimPy's heap.

A walker asks its op's handler (sim.engine.compute, .p2p, .collective; bound to the walker
once) to run the op from the walker's time t: the handler returns the op's end time; or a
`Pending` to park on, and is asked again once it is filled in; or, when the op must wait on
SimPy's clock, a generator to `yield from` whose value is the end time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from types import GeneratorType
from typing import Any

import simpy

from clustersim.schedules.ir import Op
from clustersim.sim.engine.records import Span

PROGRESS_EVERY = 4096  # ops between two calls of `on_progress`


class Pending:
    """An op's end or a message's arrival that a walker needs before it is known: its time `at`
    (None until known), a value (a message's payload) and the walkers waiting for it. Not a SimPy
    event: waiters need only the number, not SimPy's clock (which is how a stream runs ahead), so
    waking them costs no trip through SimPy's queue."""

    __slots__ = ("at", "value", "waiters")

    def __init__(self) -> None:
        self.at: float | None = None
        self.value: object = None
        self.waiters: list[Generator[Any, Any, None]] = []


# an op's end time; or a Pending to park on, after which the handler is asked again; or a
# generator to `yield from` (the op waits on SimPy's clock), whose value is the end time
Ends = float | Pending | Generator[Any, Any, float]
# a handler, made once per walker by its kind's `bind(walker)`: (op, the walker's time) -> Ends
Handler = Callable[[Any, float], Ends]
Bind = Callable[["Walker"], Handler]


class Walker:
    """One (rank, stream): what its handlers need to know of it and to write for it."""

    __slots__ = ("rank", "stream", "key", "prefix", "record", "routes")

    def __init__(self, rank: int, stream: str, record: Callable[[Span], None]):
        self.rank, self.stream, self.key = rank, stream, (rank, stream)
        self.prefix = f"{stream}:"  # a message's label: "send:SEND F0@0 r0->r1"
        self.record = record
        self.routes = _Routes(rank)  # peer -> " r{rank}->r{peer}"


class _Routes(dict):
    """peer -> a message's route text " r{rank}->r{peer}", made on first look (a dict look-up after)."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def __missing__(self, peer: int) -> str:
        self[peer] = text = f" r{self.rank}->r{peer}"
        return text


class Walkers:
    """Every walker of a run, what each waits for, the ops' end times and the spans recorded."""

    def __init__(self, env: simpy.Environment, on_progress: Callable[[int], None] | None = None):
        self.env = env
        self.on_progress = on_progress
        self.spans: list[Span] = []
        self.ends: list[float] = []  # each finished stream's last end time
        # (rank, stream) -> (op, what it waits for) while it has ops left, worded on deadlock
        self.waiting: dict[tuple[int, str], tuple[Op | None, str]] = {}
        self._ready: deque[Generator[Any, Any, None]] = deque()  # walkers woken, in wake-up order
        # rank -> label -> the op's end time, or the Pending its dependents wait on until it ends
        self._finished: dict[int, dict[str, Any]] = {}
        self._report_at = PROGRESS_EVERY

    def start(self, rank: int, stream: str, ops: list[Op], handlers: dict[type, Bind]) -> None:
        """A walker for one stream's ops; it first runs at `run_ready`."""
        self.waiting[(rank, stream)] = (None, "not started")
        self._ready.append(self._walk(rank, stream, ops, handlers, self._finished.setdefault(rank, {})))

    def wake(self, pending: Pending) -> None:
        """`pending` just learned its time: whoever waits for it runs next."""
        self._ready.extend(pending.waiters)
        pending.waiters.clear()

    def run_ready(self, walker: Generator[Any, Any, None] | None = None, value: Any = None) -> None:
        """Resume `walker` (given by a SimPy event's callback, with the event's value), then every
        woken walker, first to last, each until it waits: on a `Pending` (parked there) or on a
        SimPy event (whose callback brings it back here)."""
        ready = self._ready
        while walker is not None or ready:
            if walker is None:
                walker = ready.popleft()
            try:
                request = walker.send(value)
            except StopIteration:
                request = None
            if type(request) is Pending:
                request.waiters.append(walker)
            elif request is not None:
                request.callbacks.append(lambda event, walker=walker: self.run_ready(walker, event._value))
            walker = value = None

    def _walk(
        self, rank: int, stream: str, ops: list[Op], handlers: dict[type, Bind], done_of: dict[str, Any]
    ) -> Generator[Any, Any, None]:
        """Run one stream's ops in order on the walker's own clock `t`."""
        t: float = self.env.now
        walker = Walker(rank, stream, self.spans.append)
        handle = {kind: bind(walker) for kind, bind in handlers.items()}
        me, waiting, spans, on_progress, waits = walker.key, self.waiting, self.spans, self.on_progress, GeneratorType
        ready = self._ready
        for op in ops:
            if on_progress is not None and len(spans) >= self._report_at:
                self._report_at += PROGRESS_EVERY
                on_progress(len(spans))
            for dep in op.deps:
                end: Any = done_of.get(dep)  # its end time, None, or a Pending
                if end is None:  # not reached yet: leave a Pending for its producer to fill
                    end = done_of[dep] = Pending()
                if type(end) is Pending:
                    if end.at is None:
                        waiting[me] = (op, dep)
                        yield end
                    end = end.at
                if end > t:
                    t = end
            run = handle[type(op)]
            result: Any = run(op, t)  # Ends
            while type(result) is Pending:  # park until it is filled in, then ask again
                yield result
                result = run(op, t)
            t = (yield from result) if type(result) is waits else result
            done = done_of.get(op.label)
            if done is None:
                done_of[op.label] = t
            else:
                done.at = t  # only a Pending is there before the op ends
                if done.waiters:  # (self.wake, inline: this is the hottest loop)
                    ready.extend(done.waiters)
                    done.waiters.clear()
        del waiting[me]
        self.ends.append(t)

    def stuck(self) -> str | None:
        """What every stream that could not finish waits for, in words; None when all finished."""
        if not self.waiting:
            return None
        return "; ".join(f"rank {r} {s}: {_what_blocks(*self.waiting[(r, s)])}" for r, s in sorted(self.waiting))


def _what_blocks(op: Op | None, what: str) -> str:
    """A stuck stream's wait in words: "F0@0 waits for RECV B0@1", "... waits for SEND F0@0 from rank 0"."""
    if op is None:
        return what
    if what == "message":
        return f"{op.label} waits for SEND {op.label[5:]} from rank {op.peer}"  # type: ignore[union-attr]
    if what == "group":
        return f"{op.label} waits for ranks {', '.join(map(str, op.group))} to join"  # type: ignore[union-attr]
    if what == "in flight":
        return f"{op.label} in flight"
    return f"{op.label} waits for {what}"
