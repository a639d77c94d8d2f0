"""The engine: one walker per (rank, stream) runs its ops in order over SimPy's clock and network.

A compute op holds its stream for its cost-model time. A send waits for its dependencies, then
hands its bytes to the network and finishes when they are delivered (eager: the receiver need
not be ready; the message waits in the receiver's mailbox). A receive finishes when its message
is in the mailbox. A collective starts when the last member of its group reaches it (a
rendezvous), runs its algorithm over the network (sim.collectives) moving the members' real
buffers, and finishes on every member at once.

Walkers run ahead: each keeps its own clock and touches SimPy only where SimPy's clock matters
(transfers and collectives, which first catch SimPy up to the walker's clock). An op's end time
and a message's arrival are stored the moment they are known: a walker that finds the one it
needs just moves its clock; one that comes first leaves a `_Done` there, parks on it and is
woken, through a FIFO ready queue, when the producer fills it in. So a pipeline's many small
waits cost a dict look-up, or a list append and a generator resume, not an event through
SimPy's heap.

Tie-break rule: walkers start in (rank, stream first appearance) order, the ready queue is FIFO
and SimPy runs same-time events in the order they were scheduled, so one Program gives one record.
"""

from __future__ import annotations

import gc
from collections import defaultdict, deque
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Protocol

import numpy as np
import simpy

from clustersim.schedules.ir import Collective, Comm, Compute, Op, Program, Recv, Send
from clustersim.schedules.tags import CollectiveTag
from clustersim.sim.collectives.ops import unpack_pieces
from clustersim.sim.collectives.run import apply_collective, run_collective, run_images
from clustersim.sim.engine.records import EventLog, Span
from clustersim.sim.network.network import Network
from clustersim.sim.scale.shortcut import Shortcuts
from clustersim.sim.scale.symmetry import Symmetry


class _Done:
    """An op's end or a message's arrival that a walker needs before it is known: its time `at`
    (None until known), a value (a message's payload) and the walkers waiting for it. Not a SimPy
    event: waiters need only the number, not SimPy's clock (which is how a stream runs ahead), so
    waking them costs no trip through SimPy's queue."""

    __slots__ = ("at", "value", "waiters")

    def __init__(self) -> None:
        self.at: float | None = None
        self.value: object = None
        self.waiters: list = []


class _Lazy(dict):
    """A dict that makes a missing value with `make(key)` on first look (a mailbox's letters are
    made by whichever end looks first; label texts only for the peers a rank talks to)."""

    def __init__(self, make: Callable[[object], object]):
        super().__init__()
        self.make = make

    def __missing__(self, key):
        self[key] = value = self.make(key)
        return value


def _what_blocks(rank: int, op: Op | None, what: str) -> str:
    """A stuck stream's wait in words: "F0@0 waits for RECV B0@1", "... waits for SEND F0@0 from rank 0"."""
    if op is None:
        return what
    if what == "message":
        return f"{op.label} waits for SEND {op.label[5:]} from rank {op.peer}"
    if what == "group":
        return f"{op.label} waits for ranks {', '.join(map(str, op.group))} to join"
    if what == "in flight":
        return f"{op.label} in flight"
    return f"{op.label} waits for {what}"


class DeadlockError(RuntimeError):
    """The run ended with ops that could never start; the message says what each waits for."""


class Numerics(Protocol):
    """What the engine asks of the numerics: run compute on real arrays, move real payloads, and
    say how much more or less work than the cost model's estimate an op turned out to be (an MoE
    experts piece: the rows its routing really sent, against an even share). An all_to_all's
    input may be `Pieces`, whose routing-decided sizes then time it."""

    def run_compute(self, rank: int, op: Compute) -> None: ...
    def work(self, rank: int, op: Compute) -> float: ...
    def send_payload(self, rank: int, op: Send) -> object: ...
    def receive(self, rank: int, op: Recv, payload: object) -> None: ...
    def collective_input(self, rank: int, op: Collective) -> object: ...
    def collective_output(self, rank: int, op: Collective, result: object) -> None: ...


PROGRESS_EVERY = 4096  # ops between two calls of `on_progress`
_span = tuple.__new__  # a Span without the NamedTuple's Python-level __new__ (hot path)


@contextmanager
def _collector_paused():
    """Pause the cyclic garbage collector for the run. A run allocates millions of small objects
    that live to the end (spans, events); the collector would rescan them again and again (half
    the run time on a long pipeline) while reference counting frees the short-lived ones. At the
    end the survivors are moved out of the collector's sight (gc.freeze), or its first pass after
    the run would scan them all once more."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def run_program(
    program: Program,
    network: Network,
    compute_time_s: Callable[[Compute], float],
    rank_to_gpu: dict[int, int] | None = None,
    numerics: Numerics | None = None,
    on_progress: Callable[[int], None] | None = None,
    shortcuts: Shortcuts | None = None,
    symmetry: Symmetry | None = None,
) -> EventLog:
    """Simulate one step of `program`; return the event log. Raises DeadlockError if stuck.
    `on_progress(ops done)` is called every PROGRESS_EVERY ops and at the end (a progress bar's
    hook; the engine itself prints nothing). `shortcuts`: replay the collectives of the groups it
    allows instead of moving their flows again (sim.shortcut; the same times). `symmetry`: the
    program holds representatives only (program.images); each of their messages and collectives
    runs on all its images at once (sim.symmetry; ranks are GPUs then)."""
    if symmetry is not None and (numerics is not None or not program.images or rank_to_gpu is not None):
        raise ValueError("symmetry needs a program of representatives, ranks = GPUs and no numerics")
    rank_to_gpu = rank_to_gpu or _Lazy(lambda rank: rank)  # ranks are GPUs
    with _collector_paused():
        return _run(program, network, compute_time_s, rank_to_gpu, numerics, on_progress, shortcuts, symmetry)


def _run(program, network, compute_time_s, rank_to_gpu, numerics, on_progress, shortcuts, symmetry) -> EventLog:
    env = network.env
    report_at = [PROGRESS_EVERY]
    spans: list[Span] = []
    waiting: dict[tuple[int, str], tuple[Op | None, str]] = {}  # (op, what it waits for), worded on deadlock
    ready: deque[Generator] = deque()  # walkers woken, in wake-up order
    meetings: dict[CollectiveTag, tuple[dict[int, object], simpy.Event]] = {}  # collective tag -> (inputs, done)
    # (src rank, dst rank, tag) -> (arrival, payload) once sent, or the _Done its receiver waits on
    mailbox: dict[tuple, tuple | _Done] = {}

    def post(key: tuple, at: float, payload: object) -> None:
        """A message lands at `at`: its receiver, if already waiting, runs next."""
        box = mailbox.get(key)
        if box is None:
            mailbox[key] = (at, payload)
        else:
            box.at, box.value = at, payload
            wake(box)

    def wake(done: _Done) -> None:
        """`done` just learned its time: whoever waits for it runs next."""
        ready.extend(done.waiters)
        done.waiters.clear()

    def run_ready(walker: Generator | None = None, value: object = None) -> None:
        """Resume `walker` (given by a SimPy event's callback, with the event's value), then every
        woken walker, first to last, each until it waits: on a `_Done` (parked there) or on a SimPy
        event (whose callback brings it back here)."""
        while walker is not None or ready:
            if walker is None:
                walker = ready.popleft()
            try:
                request = walker.send(value)
            except StopIteration:
                request = None
            if type(request) is _Done:
                request.waiters.append(walker)
            elif request is not None:
                request.callbacks.append(lambda event, walker=walker: run_ready(walker, event._value))
            walker = value = None

    replays: dict[tuple, object] = {}  # (kind, algorithm, group, bytes) -> recording, or None

    def replay_of(op: Collective, nbytes) -> object:
        """The recording to replay for `op` (its group and images, sim.shortcut), or None when it
        must move its flows: an uneven all-to-all, or links that carry other traffic."""
        if shortcuts is None or np.ndim(nbytes):
            return None
        key = (op.kind, op.algorithm, op.group, nbytes)
        if key not in replays:
            images = image_groups(op)
            replays[key] = (
                shortcuts.recording(op.kind, op.algorithm, tuple(images), nbytes) if shortcuts.replays(images) else None
            )
        return replays[key]

    def image_groups(op: Collective) -> list[tuple[int, ...]]:
        """The GPUs of `op`'s group, first, and of its images (sim.symmetry)."""
        gpus = tuple(rank_to_gpu[r] for r in op.group)
        return symmetry.groups(gpus) if symmetry is not None else [gpus]

    def alone(op: Collective) -> object:
        """The recording of a replayed collective its walker meets alone (the other members are
        its images), or None. Its time is known at once, so it runs ahead like a signal: no
        meeting, no trip through SimPy."""
        return replay_of(op, op.nbytes) if symmetry is not None and len(program.members(op)) == 1 else None

    def meet(rank: int, op: Collective) -> simpy.Event:
        """Join the collective `op.tag`; the last member to arrive starts it."""
        inputs, done = meetings.setdefault(op.tag, ({}, env.event()))
        inputs[rank] = numerics.collective_input(rank, op) if numerics is not None else None
        if len(inputs) == len(program.members(op)):  # all in: the meeting (and its buffers) is the group's now
            del meetings[op.tag]
            env.process(run_group(op, inputs, done))
        return done

    def run_group(op: Collective, inputs: dict[int, object], done: simpy.Event):
        buffers, counts, nbytes = (
            unpack_pieces([inputs[r] for r in op.group], op.nbytes) if numerics is not None else (None, None, op.nbytes)
        )
        images = image_groups(op)
        gpus = images[0]
        label = f"{op.stream}:{op.label}"
        if (recording := replay_of(op, nbytes)) is not None:
            start = env.now
            yield env.timeout(recording.duration_s)
            network.replay(recording, start, label)
            outputs = (
                apply_collective(network.graph, op.kind, op.algorithm, gpus, buffers, nbytes, counts=counts)
                if buffers is not None
                else None
            )
        elif len(images) > 1:  # the group and its images, step by step together (no buffers under symmetry)
            yield env.process(run_images(network, op.kind, op.algorithm, images, nbytes, label=label))
            outputs = None
        else:
            outputs = yield env.process(
                run_collective(network, op.kind, op.algorithm, gpus, buffers, nbytes, counts=counts, label=label)
            )
        done.succeed(dict(zip(op.group, outputs)) if outputs is not None else {})

    def walk(rank: int, stream: str, ops: list[Op]):
        """Run one stream's ops in order on the walker's own clock `t`."""
        t = env.now
        done_of = finished[rank]
        gpu = rank_to_gpu[rank]
        stream_prefix = f"{stream}:"  # a message's label: "send:SEND F0@0 r0->r1"
        route_text = _Lazy(lambda peer: f" r{rank}->r{peer}")
        me, record = (rank, stream), spans.append
        for op in ops:
            if on_progress is not None and len(spans) >= report_at[0]:
                report_at[0] += PROGRESS_EVERY
                on_progress(len(spans))
            label = op.label
            for dep in op.deps:
                end = done_of.get(dep)
                if end is None:  # not reached yet: leave a _Done for its producer to fill
                    end = done_of[dep] = _Done()
                if type(end) is _Done:
                    if end.at is None:
                        waiting[me] = (op, dep)
                        yield end
                    end = end.at
                if end > t:
                    t = end
            kind = type(op)
            if kind is Compute:
                start = t
                if numerics is None:
                    t += compute_time_s(op)
                else:
                    numerics.run_compute(rank, op)
                    t += compute_time_s(op) * numerics.work(rank, op)
                record(_span(Span, (rank, stream, label, op.phase, op.microbatch, op.stage, start, t, 0.0, op.flops)))
            elif kind is Recv:
                key = (op.peer, rank, op.tag)
                letter = mailbox.get(key)
                if letter is None:  # not sent yet: wait where its sender will post it
                    box = mailbox[key] = _Done()
                    waiting[me] = (op, "message")
                    yield box
                    letter = (box.at, box.value)
                del mailbox[key]  # read once: its payload need not outlive the receive
                start = t
                if letter[0] > t:
                    t = letter[0]
                if numerics is not None:
                    numerics.receive(rank, op, letter[1])
                record(_span(Span, (rank, stream, label, Comm.RECV, op.tag[1], op.tag[2], start, t, op.nbytes, 0.0)))
            elif kind is Send and op.nbytes <= 0:  # a signal: no bandwidth, so it runs ahead too
                payload = numerics.send_payload(rank, op) if numerics is not None else None
                start = t
                t += network.signal(gpu, rank_to_gpu[op.peer], t, stream_prefix + label + route_text[op.peer])
                post((rank, op.peer, op.tag), t, payload)
                record(_span(Span, (rank, stream, label, Comm.SEND, op.tag[1], op.tag[2], start, t, 0.0, 0.0)))
            elif kind is Collective and (recording := alone(op)) is not None:  # replayed on its own: runs ahead
                start, t = t, t + recording.duration_s
                network.replay(recording, start, stream_prefix + label)
                record(_span(Span, (rank, stream, label, op.comm, None, None, start, t, op.nbytes, 0.0)))
            else:  # the network and collectives work on SimPy's clock: catch up first
                if t > env.now:
                    yield env.timeout(t - env.now)
                start = env.now
                if kind is Collective:
                    waiting[me] = (op, "group")
                    outputs = yield meet(rank, op)
                    if numerics is not None:
                        numerics.collective_output(rank, op, outputs[rank])
                    record(_span(Span, (rank, stream, label, op.comm, None, None, start, env.now, op.nbytes, 0.0)))
                else:
                    payload = numerics.send_payload(rank, op) if numerics is not None else None
                    waiting[me] = (op, "in flight")
                    if symmetry is None:
                        yield network.transfer(
                            gpu, rank_to_gpu[op.peer], op.nbytes, stream_prefix + label + route_text[op.peer]
                        )
                    else:  # the message and its images, together
                        yield network.transfer_many(
                            *symmetry.pairs(gpu, op.peer), op.nbytes, stream_prefix + label + route_text[op.peer]
                        )
                    post((rank, op.peer, op.tag), env.now, payload)
                    record(
                        _span(
                            Span, (rank, stream, label, Comm.SEND, op.tag[1], op.tag[2], start, env.now, op.nbytes, 0.0)
                        )
                    )
                t = env.now
            done = done_of.get(label)
            if done is None:
                done_of[label] = t
            else:
                done.at = t
                if done.waiters:
                    wake(done)
        waiting.pop(me, None)
        stream_ends.append(t)

    # rank -> label -> the op's end time, or the _Done its dependents wait on until it ends
    finished: dict[int, dict[str, float | _Done]] = {}
    stream_ends: list[float] = []
    for rank in program.ranks:
        streams: defaultdict[str, list[Op]] = defaultdict(list)
        for op in program.ops[rank]:
            streams[op.stream].append(op)
        finished[rank] = {}
        for stream, ops in streams.items():
            waiting[(rank, stream)] = (None, "not started")
            ready.append(walk(rank, stream, ops))
    run_ready()
    env.run()
    if on_progress is not None:
        on_progress(len(spans))
    if waiting:
        blocked = "; ".join(f"rank {r} {s}: {_what_blocks(r, *waiting[(r, s)])}" for r, s in sorted(waiting))
        raise DeadlockError(f"deadlock at t={env.now:.6g}s: {blocked}")
    step_s = max(stream_ends, default=0.0)
    num_ranks = symmetry.world if symmetry is not None else len(program.ranks)
    return EventLog(
        tuple(spans),
        network.flow_table(),
        num_ranks,
        network.link_names,
        network.link_stats(step_s),
        tuple(program.ranks) if symmetry is not None else None,
    )
