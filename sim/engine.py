"""The SimPy engine: one process per (rank, stream) walks its ops in order.

A compute op holds its stream for its cost-model time. A send waits for its dependencies, then
hands its bytes to the network and finishes when they are delivered (eager: the receiver need
not be ready; the message waits in the receiver's mailbox). A receive finishes when its message
is in the mailbox. `deps` are waited on through one SimPy event per op that something depends on.

Tie-break rule: SimPy runs events scheduled for the same time in the order they were scheduled;
processes are created in (rank, stream first appearance) order, so one Program gives one record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import simpy

from schedules.ir import Compute, Op, Program, Recv, Send
from sim.network import Network
from sim.records import EventLog, Span


class DeadlockError(RuntimeError):
    """The run ended with ops that could never start; the message says what each waits for."""


class Numerics(Protocol):
    """What the engine asks of the numerics: run compute on real arrays, move real payloads."""

    def run_compute(self, rank: int, op: Compute) -> None: ...
    def send_payload(self, rank: int, op: Send) -> object: ...
    def receive(self, rank: int, op: Recv, payload: object) -> None: ...


class _NoNumerics:
    def run_compute(self, rank, op):
        pass

    def send_payload(self, rank, op):
        return None

    def receive(self, rank, op, payload):
        pass


def run_program(program: Program, network: Network, compute_time_s: Callable[[Compute], float],
                rank_to_gpu: dict[int, int] | None = None, numerics: Numerics | None = None) -> EventLog:
    """Simulate one step of `program`; return the event log. Raises DeadlockError if stuck."""
    env = network.env
    numerics = numerics or _NoNumerics()
    rank_to_gpu = rank_to_gpu or {rank: rank for rank in program.ranks}
    needed = {(rank, dep) for rank in program.ranks for op in program.ops[rank] for dep in op.deps}
    finished = {key: env.event() for key in sorted(needed)}
    mailbox: dict[tuple[int, int, tuple], simpy.Event] = {}
    spans: list[Span] = []
    waiting: dict[tuple[int, str], str] = {}

    def letter(src: int, dst: int, tag: tuple) -> simpy.Event:
        key = (src, dst, tag)
        if key not in mailbox:
            mailbox[key] = env.event()
        return mailbox[key]

    def walk(rank: int, stream: str, plan: list[tuple]):
        """Run one stream's ops in order; `plan` holds what each op needs, computed before the run."""
        for op, label, deps, done, duration_s in plan:
            for dep, event in deps:
                if not event.triggered:
                    waiting[(rank, stream)] = f"{label} waits for {dep}"
                    yield event
            start = env.now
            if duration_s is not None:
                numerics.run_compute(rank, op)
                yield env.timeout(duration_s)
                spans.append(Span(rank, stream, label, op.phase, op.microbatch, op.stage, start, env.now, 0.0, op.flops))
            elif isinstance(op, Send):
                payload = numerics.send_payload(rank, op)
                waiting[(rank, stream)] = f"{label} in flight"
                yield network.transfer(rank_to_gpu[rank], rank_to_gpu[op.peer], op.nbytes, f"{label} r{rank}->r{op.peer}",
                                       letter(rank, op.peer, op.tag), payload)
                spans.append(Span(rank, stream, label, "SEND", op.tag[1], op.tag[2], start, env.now, op.nbytes, 0.0))
            else:
                waiting[(rank, stream)] = f"{label} waits for SEND {label[5:]} from rank {op.peer}"
                numerics.receive(rank, op, (yield letter(op.peer, rank, op.tag)))
                spans.append(Span(rank, stream, label, "RECV", op.tag[1], op.tag[2], start, env.now, op.nbytes, 0.0))
            if done is not None:
                done.succeed()
        waiting.pop((rank, stream), None)

    for rank in program.ranks:
        plans: dict[str, list[tuple]] = {}
        for op in program.ops[rank]:
            label = op.label
            plans.setdefault(op.stream, []).append((
                op, label, [(dep, finished[(rank, dep)]) for dep in op.deps], finished.get((rank, label)),
                compute_time_s(op) if isinstance(op, Compute) else None))
        for stream, plan in plans.items():
            waiting[(rank, stream)] = "not started"
            env.process(walk(rank, stream, plan))
    env.run()
    if waiting:
        blocked = "; ".join(f"rank {r} {s}: {what}" for (r, s), what in sorted(waiting.items()))
        raise DeadlockError(f"deadlock at t={env.now:.6g}s: {blocked}")
    step_s = max((span.end_s for span in spans), default=0.0)
    return EventLog(tuple(spans), tuple(network.flow_spans()), len(program.ranks), network.link_names,
                    network.link_stats(step_s))
