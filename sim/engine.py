"""The SimPy engine: one process per (rank, stream) walks its ops in order.

A compute op holds its stream for its cost-model time. A send waits for its dependencies, then
hands its bytes to the network and finishes when they are delivered (eager: the receiver need
not be ready; the message waits in the receiver's mailbox). A receive finishes when its message
is in the mailbox. A collective starts when the last member of its group reaches it (a
rendezvous), runs its algorithm over the network (sim.collectives) moving the members' real
buffers, and finishes on every member at once. `deps` are waited on through one SimPy event per op that something depends on.

Tie-break rule: SimPy runs events scheduled for the same time in the order they were scheduled;
processes are created in (rank, stream first appearance) order, so one Program gives one record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import simpy

from schedules.ir import Collective, Compute, Op, Program, Recv, Send
from sim.collectives.run import run_collective
from sim.network import Network
from sim.records import EventLog, Span


class _Done(simpy.Event):
    """The end of an op others wait on, or a message's arrival; an op that ran ahead schedules it
    for its end time (one event, where a timeout with a callback would take two)."""

    def succeed_in(self, delay_s: float, value: object = None) -> None:
        self._ok, self._value = True, value
        self.env.schedule(self, simpy.events.NORMAL, delay_s)


class DeadlockError(RuntimeError):
    """The run ended with ops that could never start; the message says what each waits for."""


class Numerics(Protocol):
    """What the engine asks of the numerics: run compute on real arrays, move real payloads."""

    def run_compute(self, rank: int, op: Compute) -> None: ...
    def send_payload(self, rank: int, op: Send) -> object: ...
    def receive(self, rank: int, op: Recv, payload: object) -> None: ...
    def collective_input(self, rank: int, op: Collective) -> object: ...
    def collective_output(self, rank: int, op: Collective, result: object) -> None: ...


PROGRESS_EVERY = 4096  # ops between two calls of `on_progress`


def run_program(program: Program, network: Network, compute_time_s: Callable[[Compute], float],
                rank_to_gpu: dict[int, int] | None = None, numerics: Numerics | None = None,
                on_progress: Callable[[int], None] | None = None) -> EventLog:
    """Simulate one step of `program`; return the event log. Raises DeadlockError if stuck.
    `on_progress(ops done)` is called every PROGRESS_EVERY ops and at the end (a progress bar's
    hook; the engine itself prints nothing)."""
    env = network.env
    report_at = [PROGRESS_EVERY]
    rank_to_gpu = rank_to_gpu or {rank: rank for rank in program.ranks}
    finished: dict[int, dict[str, simpy.Event]] = {}  # rank -> label -> done event, for ops others wait on
    for rank in program.ranks:
        needed = sorted({dep for op in program.ops[rank] for dep in op.deps})
        finished[rank] = {label: _Done(env) for label in needed}
    mailbox: dict[tuple[int, int, tuple], _Done] = {}
    spans: list[Span] = []
    waiting: dict[tuple[int, str], tuple[str, str, str]] = {}  # what a stream is stuck on, worded on deadlock

    meetings: dict[str, tuple[dict[int, object], simpy.Event]] = {}  # collective tag -> (inputs, done)

    def meet(rank: int, op: Collective) -> simpy.Event:
        """Join the collective `op.tag`; the last member to arrive starts it."""
        inputs, done = meetings.setdefault(op.tag, ({}, env.event()))
        inputs[rank] = numerics.collective_input(rank, op) if numerics is not None else None
        if len(inputs) == len(op.group):
            env.process(run_group(op, inputs, done))
        return done

    def run_group(op: Collective, inputs: dict[int, object], done: simpy.Event):
        buffers = [inputs[r] for r in op.group] if numerics is not None else None
        outputs = yield env.process(run_collective(
            network, op.kind, op.algorithm, [rank_to_gpu[r] for r in op.group], buffers, op.nbytes,
            label=f"{op.stream}:{op.label}"))
        done.succeed(dict(zip(op.group, outputs)) if outputs is not None else {})

    def letter(src: int, dst: int, tag: tuple) -> _Done:
        key = (src, dst, tag)
        if key not in mailbox:
            mailbox[key] = _Done(env)
        return mailbox[key]

    def walk(rank: int, stream: str, ops: list[Op]):
        """Run one stream's ops in order.

        Ops run ahead: the stream keeps its own clock `t` and only yields to SimPy when it must
        wait (a dependency or message not in by `t`, a transfer or collective, which work on
        SimPy's clock, the end), first catching SimPy's clock up to `t`. An op's `done` event is
        scheduled for the time the op ends.
        """
        t = env.now
        done_of = finished[rank]
        for op in ops:
            if on_progress is not None and len(spans) >= report_at[0]:
                report_at[0] += PROGRESS_EVERY
                on_progress(len(spans))
            label = op.label
            for dep in op.deps:
                event = done_of[dep]
                if not event.processed:
                    if t > env.now:  # it may finish before t: catch up, then look again
                        yield env.timeout(t - env.now)
                    if not event.processed:
                        waiting[(rank, stream)] = (label, "waits for", dep)
                        yield event
                    t = max(t, env.now)
            done = done_of.get(label)
            if type(op) is Compute:
                if numerics is not None:
                    numerics.run_compute(rank, op)
                start, t = t, t + compute_time_s(op)
                spans.append(Span(rank, stream, label, op.phase, op.microbatch, op.stage, start, t, 0.0, op.flops))
                if done is not None:
                    done.succeed_in(t - env.now)
                continue
            start = t
            if type(op) is Recv:  # runs ahead too when its message is already in
                box = letter(op.peer, rank, op.tag)
                if not box.processed:
                    if t > env.now:
                        yield env.timeout(t - env.now)
                    if not box.processed:
                        waiting[(rank, stream)] = (label, "waits for", f"SEND {label[5:]} from rank {op.peer}")
                        yield box
                    t = max(t, env.now)
                if numerics is not None:
                    numerics.receive(rank, op, box.value)
                spans.append(Span(rank, stream, label, "RECV", op.tag[1], op.tag[2], start, t, op.nbytes, 0.0))
            elif type(op) is Send and op.nbytes <= 0:  # a signal: no bandwidth, so it runs ahead too
                payload = numerics.send_payload(rank, op) if numerics is not None else None
                t += network.signal(rank_to_gpu[rank], rank_to_gpu[op.peer], t, f"{stream}:{label} r{rank}->r{op.peer}")
                letter(rank, op.peer, op.tag).succeed_in(t - env.now, payload)
                spans.append(Span(rank, stream, label, "SEND", op.tag[1], op.tag[2], start, t, 0.0, 0.0))
            else:  # the network and collectives work on SimPy's clock: catch up first
                if t > env.now:
                    yield env.timeout(t - env.now)
                start = env.now
                if type(op) is Collective:
                    waiting[(rank, stream)] = (label, "waits for", f"ranks {', '.join(map(str, op.group))} to join")
                    outputs = yield meet(rank, op)
                    if numerics is not None:
                        numerics.collective_output(rank, op, outputs[rank])
                    spans.append(Span(rank, stream, label, op.kind.upper(), None, None, start, env.now, op.nbytes, 0.0))
                else:
                    payload = numerics.send_payload(rank, op) if numerics is not None else None
                    waiting[(rank, stream)] = (label, "in flight", "")
                    yield network.transfer(rank_to_gpu[rank], rank_to_gpu[op.peer], op.nbytes,
                                           f"{stream}:{label} r{rank}->r{op.peer}", letter(rank, op.peer, op.tag),
                                           payload)
                    spans.append(Span(rank, stream, label, "SEND", op.tag[1], op.tag[2], start, env.now, op.nbytes,
                                      0.0))
                t = env.now
            if done is not None:
                done.succeed_in(t - env.now)
        if t > env.now:
            yield env.timeout(t - env.now)
        waiting.pop((rank, stream), None)

    for rank in program.ranks:
        streams: dict[str, list[Op]] = {}
        for op in program.ops[rank]:
            streams.setdefault(op.stream, []).append(op)
        for stream, ops in streams.items():
            waiting[(rank, stream)] = ("", "not started", "")
            env.process(walk(rank, stream, ops))
    env.run()
    if on_progress is not None:
        on_progress(len(spans))
    if waiting:
        blocked = "; ".join(f"rank {r} {s}: {' '.join(p for p in what if p)}" for (r, s), what in sorted(waiting.items()))
        raise DeadlockError(f"deadlock at t={env.now:.6g}s: {blocked}")
    step_s = max((span.end_s for span in spans), default=0.0)
    return EventLog(tuple(spans), tuple(network.flow_spans()), len(program.ranks), network.link_names,
                    network.link_stats(step_s))
