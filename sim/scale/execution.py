"""How a run moves its ranks' work: the one interface the engine asks about scale.

The engine walks the ranks its program holds and, for every message and collective, asks a
`Scale` how it moves. The plain `Scale` answers with identity: every rank walks, a collective
waits for its whole group, a message moves once, and a collective moves its flows (or, where
sim.scale.shortcut allows, replays a recording of them). `Symmetric` answers for a program of
representatives (sim.scale.symmetry): a collective waits for the members the program holds, and a
message or collective moves together with all its images; a replayed collective met by one
walker alone needs no meeting, so its walker runs ahead.

`make_scale` builds the one Network a run uses, with the orbits sim.network may solve once
(sim.network.orbits) when the run is symmetric.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Mapping

import networkx as nx
import numpy as np
import simpy

from clustersim.schedules.ir import Collective, Program
from clustersim.sim.collectives.nccl_p2p import wire
from clustersim.sim.collectives.run import apply_collective, run_collective, run_images, step_pairs
from clustersim.sim.network.ledger import Recording
from clustersim.sim.network.network import Network
from clustersim.sim.scale.shortcut import Shortcuts
from clustersim.sim.scale.symmetry import Symmetry
from clustersim.topologies.routing import make_router

GroupKey = tuple[str, str, tuple[int, ...], float]  # (kind, algorithm, group, bytes)
Wired = tuple[np.ndarray, np.ndarray, np.ndarray] | None  # a message's flows (nccl_p2p.wire)


class _Identity(dict):
    """rank -> GPU when ranks are GPUs (kept on first look: a dict look-up after)."""

    def __missing__(self, rank: int) -> int:
        self[rank] = rank
        return rank


class Scale:
    """The plain run: every rank walks, each message and collective moves once (see the module
    docstring). `rank_to_gpu`: default, ranks are GPUs; `shortcuts`: the groups whose
    collectives are replayed (None: every collective moves its flows)."""

    symmetry: Symmetry | None = None

    def __init__(
        self, network: Network, rank_to_gpu: Mapping[int, int] | None = None, shortcuts: Shortcuts | None = None
    ):
        self.network = network
        self.gpu: Mapping[int, int] = rank_to_gpu if rank_to_gpu is not None else _Identity()
        self.shortcuts = shortcuts
        self._replays: dict[GroupKey, Recording | None] = {}
        self._wired: dict[tuple[int, int, float], Wired] = {}

    # -- what the engine asks -------------------------------------------------------------------

    def in_person(self, op: Collective) -> int:
        """How many members of `op`'s group reach it (the last to arrive starts it)."""
        return len(op.group)

    def send(self, rank: int, peer: int, nbytes: float, label: str) -> simpy.Event:
        """Move a message rank -> peer; the event fires when it lands (as NCCL moves it, when
        the graph has the NCCL layer: sim.collectives.nccl_p2p)."""
        flows = self.wired(rank, peer, nbytes)
        if flows is None:
            return self.network.transfer(self.gpu[rank], self.gpu[peer], nbytes, label)
        return self.network.transfer_many(*flows, label)

    def wired(self, rank: int, peer: int, nbytes: float) -> Wired:
        """The flows of a message rank -> peer and its images (nccl_p2p.wire), or None without the
        NCCL layer; kept per message (a pipeline sends the same few hundreds of thousands of times)."""
        key = (rank, peer, nbytes)
        if key not in self._wired:
            src, dst = self.messages(rank, peer)
            self._wired[key] = wire(self.network.graph, src, dst, nbytes)
        return self._wired[key]

    def messages(self, rank: int, peer: int) -> tuple:
        """(sources, destinations) of a message rank -> peer: the one, here."""
        return [self.gpu[rank]], [self.gpu[peer]]

    def signal_from(self, rank: int) -> Callable[[int, float, str], float]:
        """(peer, start_s, label) -> latency: record a zero-byte message from `rank` sent at
        `start_s` (alone: it takes no bandwidth, and its images would land at the same time)."""
        signal, gpu, src = self.network.signal, self.gpu, self.gpu[rank]
        return lambda peer, start_s, label: signal(src, gpu[peer], start_s, label)

    def ahead(self, op: Collective) -> Recording | None:
        """The recording of a collective whose time is known the moment its walker reaches it (no
        meeting, no trip through SimPy), or None: never in a plain run, whose members all meet."""
        return None

    def collective(
        self, op: Collective, buffers: list | None, nbytes, counts, label: str
    ) -> Generator[simpy.Event, object, list | None]:
        """The body of a met collective's SimPy process (run with `yield from`): replayed, moved
        with its images, or moved; the members' outputs (None without buffers)."""
        env, network = self.network.env, self.network
        images = self.groups(op)
        gpus = images[0]
        recording = self.replayed(op, nbytes)
        if recording is not None:
            start = env.now
            yield env.timeout(recording.duration_s)
            network.replay(recording, start, label)
            if buffers is None:
                return None
            return apply_collective(network.graph, op.kind, op.algorithm, gpus, buffers, nbytes, counts=counts)
        if len(images) > 1:  # the group and its images, step by step together (no buffers under symmetry)
            yield env.process(run_images(network, op.kind, op.algorithm, images, nbytes, label=label))
            return None
        outputs = yield env.process(
            run_collective(network, op.kind, op.algorithm, gpus, buffers, nbytes, counts=counts, label=label)
        )
        return outputs  # type: ignore[return-value]  # the process's value: run_collective's outputs

    def ranks(self, program: Program) -> tuple[int, tuple[int, ...] | None]:
        """(ranks in the run, the ranks whose spans stand for all or None), for the EventLog."""
        return len(program.ranks), None

    # -- shared by both paths ---------------------------------------------------------------------

    def groups(self, op: Collective) -> list[tuple[int, ...]]:
        """The GPUs of `op`'s group: alone here, followed by its images under symmetry."""
        return [tuple(self.gpu[r] for r in op.group)]

    def replayed(self, op: Collective, nbytes) -> Recording | None:
        """The recording to replay for `op` (sim.scale.shortcut), or None when it must move its flows:
        no shortcuts, an uneven all-to-all, or links that carry other traffic."""
        if self.shortcuts is None or np.ndim(nbytes):
            return None
        key = (op.kind, op.algorithm, op.group, nbytes)
        if key not in self._replays:
            images = self.groups(op)
            self._replays[key] = (
                self.shortcuts.recording(self.network, op.kind, op.algorithm, tuple(images), nbytes)
                if self.shortcuts.replays(images)
                else None
            )
        return self._replays[key]

    @property
    def replayed_groups(self) -> int:
        return len(self.shortcuts.groups) if self.shortcuts is not None else 0


class Symmetric(Scale):
    """A program of representatives (sim.scale.symmetry; ranks are GPUs): every message and
    collective moves with its images; a collective waits only for the members the program holds."""

    def __init__(self, network: Network, symmetry: Symmetry, program: Program, shortcuts: Shortcuts | None = None):
        if program.ranks != symmetry.representatives:
            raise ValueError("a symmetric run walks a program of exactly the representatives")
        super().__init__(network, None, shortcuts)
        self.symmetry: Symmetry = symmetry
        self.joins = members_held(program)
        self._ahead: dict[GroupKey, Recording | None] = {}

    def in_person(self, op: Collective) -> int:
        return len(self.joins(op))

    def send(self, rank: int, peer: int, nbytes: float, label: str) -> simpy.Event:
        """The message and its images, together."""
        flows = self.wired(rank, peer, nbytes)
        if flows is None:
            return self.network.transfer_many(*self.symmetry.pairs(rank, peer), nbytes, label)
        return self.network.transfer_many(*flows, label)

    def messages(self, rank: int, peer: int) -> tuple:
        """The message and its images."""
        return self.symmetry.pairs(rank, peer)

    def ahead(self, op: Collective) -> Recording | None:
        """A replayed collective that its walker meets alone (the other members are its images)."""
        key = (op.kind, op.algorithm, op.group, op.nbytes)
        if (found := self._ahead.get(key, self)) is self:  # (None is an answer: not ahead)
            found = self._ahead[key] = self.replayed(op, op.nbytes) if self.in_person(op) == 1 else None
        return found  # type: ignore[return-value]

    def groups(self, op: Collective) -> list[tuple[int, ...]]:
        return self.symmetry.groups(op.group)

    def ranks(self, program: Program) -> tuple[int, tuple[int, ...] | None]:
        return self.symmetry.world, tuple(program.ranks)

    @property
    def messages_per_flow(self) -> int:
        """Messages one network flow stands for (sim.network.orbits; 1 when the network moves each)."""
        return self.network.orbits.size if self.network.orbits is not None else 1


def members_held(program: Program):
    """op -> the members of its group that `program` holds (they join in person; the others are
    images of them), kept per group."""
    held: dict[tuple[int, ...], tuple[int, ...]] = {}

    def joins(op: Collective) -> tuple[int, ...]:
        if (members := held.get(op.group)) is None:
            members = held[op.group] = tuple(r for r in op.group if r in program.ops)
        return members

    return joins


def make_scale(program: Program, graph: nx.DiGraph, symmetry: Symmetry | None, replays: bool = True) -> Scale:
    """The scale of a run of `program` on `graph`, with its one Network. `symmetry`: the run's
    shifts, used when the program holds exactly their representatives; `replays`: replay the
    collectives of groups whose links carry nothing else (sim.scale.shortcut)."""
    if symmetry is not None and program.ranks != symmetry.representatives:
        symmetry = None
    router = make_router(graph)
    shortcuts = Shortcuts(program, graph, router, symmetry=symmetry) if replays else None
    images = None
    if symmetry is not None and shortcuts is not None:  # without replays every flow is moved
        images = symmetry.network_images(_self_mapped_steps(graph, shortcuts, symmetry))
    network = Network(simpy.Environment(), graph, router, images)
    if symmetry is None:
        return Scale(network, shortcuts=shortcuts)
    return Symmetric(network, symmetry, program, shortcuts)


def _self_mapped_steps(
    graph: nx.DiGraph, shortcuts: Shortcuts, symmetry: Symmetry
) -> Iterator[tuple[tuple[int, ...], list]]:
    """Each collective that moves its flows on a group some shift maps onto itself: the group
    and its steps' (sources, destinations), for Symmetry.network_images."""
    for group, kind, algorithm, nbytes in sorted({c[:4] for c in shortcuts.collectives}):
        images = symmetry.groups(group)
        if len(images) < symmetry.images_per_rank and not shortcuts.replays(images):
            yield group, step_pairs(graph, kind, algorithm, group, nbytes)
