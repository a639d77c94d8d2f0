"""The engine's loop: one walker per (rank, stream) runs its ops in order over SimPy's clock and
the network; one handler per op kind (sim.engine.compute, .p2p, .collective) runs each op; the
run's Scale (sim.scale.execution) says how messages and collectives move; the spans and the
network's record make the EventLog (sim.engine.records).

Tie-break rule, the one place it is stated: walkers start in (rank, first appearance of the
stream in the rank's ops) order; woken walkers resume in the order they were woken (first in,
first out); SimPy runs events due at the same time in the order they were scheduled. Nothing
else orders the run, and nothing draws random numbers, so one Program gives one record, bit for
bit, run after run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping

from clustersim.schedules.ir import Collective, Compute, Op, Program, Recv, Send
from clustersim.sim.collector import collector_paused
from clustersim.sim.engine.collective import CollectiveHandler
from clustersim.sim.engine.compute import ComputeHandler
from clustersim.sim.engine.numerics import Numerics
from clustersim.sim.engine.p2p import PointToPoint
from clustersim.sim.engine.records import EventLog
from clustersim.sim.engine.walkers import PROGRESS_EVERY, Bind, Walkers
from clustersim.sim.network.network import Network
from clustersim.sim.scale.execution import Scale

__all__ = ["PROGRESS_EVERY", "DeadlockError", "Numerics", "run_program"]


class DeadlockError(RuntimeError):
    """The run ended with ops that could never start; the message says what each waits for."""


def run_program(
    program: Program,
    network: Network,
    compute_time_s: Callable[[Compute], float],
    rank_to_gpu: Mapping[int, int] | None = None,
    numerics: Numerics | None = None,
    on_progress: Callable[[int], None] | None = None,
    scale: Scale | None = None,
) -> EventLog:
    """Simulate one step of `program` on `network`; return the event log. Raises DeadlockError
    if stuck. `on_progress(ops done)` is called every PROGRESS_EVERY ops and at the end (a
    progress bar's hook; the engine itself prints nothing). `scale`: how messages and
    collectives move (sim.scale.make_scale; its network is `network`); default the plain run,
    ranks on GPUs `rank_to_gpu` (default: rank = GPU)."""
    scale = scale or Scale(network, rank_to_gpu)
    if scale.network is not network:
        raise ValueError("the scale moves bytes on another network than the run's")
    if scale.symmetry is not None and numerics is not None:
        raise ValueError("a symmetric run walks representatives only: it runs no numerics")
    with collector_paused():
        return _run(program, scale, compute_time_s, numerics, on_progress)


def _run(
    program: Program,
    scale: Scale,
    compute_time_s: Callable[[Compute], float],
    numerics: Numerics | None,
    on_progress: Callable[[int], None] | None,
) -> EventLog:
    """Start one walker per (rank, stream), run SimPy to the end, check every stream finished."""
    network, env = scale.network, scale.network.env
    walkers = Walkers(env, on_progress)
    p2p = PointToPoint(env, walkers, scale, numerics)
    handlers: dict[type, Bind] = {
        Compute: ComputeHandler(compute_time_s, numerics).bind,
        Send: p2p.bind_send,
        Recv: p2p.bind_recv,
        Collective: CollectiveHandler(env, walkers, scale, numerics).bind,
    }
    for rank in program.ranks:
        for stream, ops in _streams(program.ops[rank]):
            walkers.start(rank, stream, ops, handlers)
    walkers.run_ready()
    env.run()
    if on_progress is not None:
        on_progress(len(walkers.spans))
    if (stuck := walkers.stuck()) is not None:
        raise DeadlockError(f"deadlock at t={env.now:.6g}s: {stuck}")
    num_ranks, represented = scale.ranks(program)
    flows = network.flow_table()
    links = network.link_stats(max(walkers.ends, default=0.0))  # over the step: the last stream's end
    return EventLog(tuple(walkers.spans), flows, num_ranks, network.link_names, links, represented)


def _streams(ops: list[Op]) -> Iterator[tuple[str, list[Op]]]:
    """A rank's ops by stream, streams in order of first appearance."""
    streams: defaultdict[str, list[Op]] = defaultdict(list)
    for op in ops:
        streams[op.stream].append(op)
    return iter(streams.items())
