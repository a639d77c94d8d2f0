"""The op IR: what one rank does, one op at a time, on named streams.

Ops on one stream run in order, like a CUDA stream; `deps` name ops (by label) on other streams
of the same rank that must finish first, like CUDA events. Every op has a one-line text form
that round-trips through `parse_op` (schedules.text):

    compute: F3@1                      forward of microbatch 3 on global pipeline stage 1
    compute: F3@1.2 after ALL_REDUCE tp@d0.F3@1.1   its third piece, cut at tensor-parallel collectives
    compute: B3@1 after RECV B3@2      backward, waits for the gradient from stage 2
    compute: OPT@1 4.2e+10B            optimizer step of stage 1's parameters, touching 42 GB
    send: SEND F3@1 ->2 4096B after F3@1
    recv: RECV F3@0 <-0 4096B
    dp: ALL_REDUCE grads@1.b0 [1,5] 1048576B ring after B7@1

A message's tag is (phase, microbatch, producer stage), so `SEND F3@1` on one rank matches
`RECV F3@1` on its peer. A collective's tag (schedules.tags) names it on every member of its group
(the ranks in brackets, in the group's order); its size means what it means in nccl-tests. Labels
are unique within a rank; each op computes its label once, at construction.

Phases and kinds are string enums (`Phase`, `Comm`), so they print, compare and serialise as the
letters they stand for.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar, NamedTuple

from clustersim.schedules.tags import CollectiveTag

COMPUTE_STREAM = "compute"
SEND_STREAM = "send"
RECV_STREAM = "recv"
DP_STREAM = "dp"  # data parallelism's and ZeRO's collectives (schedules.data_parallel, schedules.zero3)


class Phase(StrEnum):
    """What a compute op does for its stage (and microbatch)."""

    F = "F"  # forward
    B = "B"  # backward: the input gradient, and the weight gradient unless W is split off
    W = "W"  # weight gradient alone (zero-bubble schedules split it off B)
    R = "R"  # recompute of a forward's activations before its backward
    OPT = "OPT"  # optimizer step


PHASES = tuple(Phase)
PIPELINE_PHASES = (Phase.F, Phase.B)  # the phases that carry microbatches between stages
MICROBATCH_PHASES = (Phase.F, Phase.B, Phase.W)  # a stage's per-microbatch compute
GRADIENT_PHASES = (Phase.B, Phase.W)  # the phases that add to a stage's weight gradients


class MessageTag(NamedTuple):
    """What a point-to-point message carries: the output of `phase` for `microbatch` on `stage`."""

    phase: Phase
    microbatch: int
    stage: int

    def __str__(self) -> str:
        return f"{self.phase}{self.microbatch}@{self.stage}"


COLLECTIVE_KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")


class Comm(StrEnum):
    """A communication op's kind as its span's phase: SEND, RECV, or a collective kind in capitals."""

    SEND = "SEND"
    RECV = "RECV"
    ALL_REDUCE = "ALL_REDUCE"
    REDUCE_SCATTER = "REDUCE_SCATTER"
    ALL_GATHER = "ALL_GATHER"
    BROADCAST = "BROADCAST"
    REDUCE = "REDUCE"
    ALL_TO_ALL = "ALL_TO_ALL"

    @staticmethod
    def of(kind: str) -> Comm:
        """The span phase of collective `kind` ("all_reduce" -> ALL_REDUCE)."""
        return _COMM_OF_KIND[kind]


_COMM_OF_KIND = {kind: Comm(kind.upper()) for kind in COLLECTIVE_KINDS}
_KIND_TEXT = {kind: kind.upper() for kind in COLLECTIVE_KINDS}  # plain text, for labels (made often)
SpanPhase = Phase | Comm  # what an event span's phase is


@dataclass(frozen=True, slots=True)
class Compute:
    """Forward (F), backward (B) or optimizer step (OPT) of one stage's layers for one microbatch.

    `part` numbers the pieces of a forward or backward that tensor parallelism cuts at its
    collectives (label F3@1.0, F3@1.1, ...; None: the op is whole). The pieces of one op run in
    order on one stream; the first waits for what the whole op waits for, and whoever uses the
    op's result waits for the last."""

    phase: Phase
    microbatch: int | None
    stage: int
    flops: float = 0.0
    nbytes: float = 0.0  # memory traffic, for memory-bound ops such as the optimizer step
    stream: str = COMPUTE_STREAM
    deps: tuple[str, ...] = ()
    part: int | None = None
    label: str = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        label = f"OPT@{self.stage}" if self.phase == Phase.OPT else f"{self.phase}{self.microbatch}@{self.stage}"
        object.__setattr__(self, "label", label if self.part is None else f"{label}.{self.part}")


@dataclass(frozen=True, slots=True)
class _PointToPoint:
    """A message with `peer`, tagged `tag`, of `nbytes`; the subclass says which end it is."""

    peer: int
    tag: MessageTag
    nbytes: float
    stream: str
    deps: tuple[str, ...] = ()
    label: str = field(init=False, repr=False, compare=False)
    KIND: ClassVar[Comm]

    def __post_init__(self):
        if type(self.tag) is not MessageTag:  # a plain (phase, microbatch, stage) tuple
            object.__setattr__(self, "tag", MessageTag(Phase(self.tag[0]), self.tag[1], self.tag[2]))
        object.__setattr__(self, "label", f"{self.KIND} {self.tag}")


@dataclass(frozen=True, slots=True)
class Send(_PointToPoint):
    """Point-to-point send of the tensor tagged `tag` to rank `peer` (eager: buffered at the peer)."""

    stream: str = SEND_STREAM
    KIND: ClassVar[Comm] = Comm.SEND


@dataclass(frozen=True, slots=True)
class Recv(_PointToPoint):
    """Point-to-point receive of the tensor tagged `tag` from rank `peer`; done when it arrives."""

    stream: str = RECV_STREAM
    KIND: ClassVar[Comm] = Comm.RECV


@dataclass(frozen=True, slots=True)
class Collective:
    """One rank's part in a collective over `group` (ranks); every member has the same tag.
    `comm`: its kind as a span's phase."""

    kind: str
    tag: CollectiveTag
    group: tuple[int, ...]
    nbytes: float
    algorithm: str = "auto"
    stream: str = "dp"
    deps: tuple[str, ...] = ()
    label: str = field(init=False, repr=False, compare=False)
    comm: Comm = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "comm", _COMM_OF_KIND[self.kind])
        object.__setattr__(self, "label", f"{_KIND_TEXT[self.kind]} {self.tag.text}")


Op = Compute | Send | Recv | Collective


def with_deps(op: Op, deps: tuple[str, ...]) -> Op:
    """`op` waiting for `deps` instead (a program cut at its tensor-parallel collectives copies
    millions of ops): `_replaced`."""
    return _replaced(op, "deps", deps)


def _replaced(op: Op, name: str, value: object) -> Op:
    """dataclasses.replace(op, name=value) for a field the op's derived ones (label, comm) do not
    read (deps, peer, group), without running __init__ and __post_init__ again."""
    names = _FIELD_NAMES.get(type(op))
    if names is None:
        names = _FIELD_NAMES[type(op)] = tuple(f.name for f in dataclasses.fields(op))
    new = object.__new__(type(op))
    for field_name in names:
        object.__setattr__(new, field_name, getattr(op, field_name))
    object.__setattr__(new, name, value)
    return new


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # an op type -> its fields, label included


@dataclass
class Program:
    """rank -> ordered ops, plus the facts about the pipelines the validator needs.

    `stage_to_rank` places one pipeline's stages; with data parallelism every replica is a
    pipeline of its own, and `replicas` lists each one's placement.
    """

    ops: dict[int, list[Op]]
    num_stages: int
    num_microbatches: int
    stage_to_rank: dict[int, int] = field(default_factory=dict)
    replicas: tuple[dict[int, int], ...] = ()

    @property
    def ranks(self) -> list[int]:
        return sorted(self.ops)

    def pipelines(self) -> list[Program]:
        """One Program per pipeline replica, holding only that replica's ranks."""
        placements = self.replicas or (self.stage_to_rank,)
        return [
            Program(
                {r: self.ops[r] for r in sorted(set(placement.values()))},
                self.num_stages,
                self.num_microbatches,
                dict(placement),
            )
            for placement in placements
        ]

    def relabel(self, new_rank: dict[int, int]) -> Program:
        """The same program with rank r renamed new_rank[r] (in op lists, peers and placements)."""

        def moved(op: Op) -> Op:
            if isinstance(op, (Send, Recv)):
                return _replaced(op, "peer", new_rank[op.peer])
            if isinstance(op, Collective):
                return _replaced(op, "group", tuple(new_rank[r] for r in op.group))
            return op

        return Program(
            {new_rank[r]: [moved(op) for op in ops] for r, ops in self.ops.items()},
            self.num_stages,
            self.num_microbatches,
            {s: new_rank[r] for s, r in self.stage_to_rank.items()},
            tuple({s: new_rank[r] for s, r in placement.items()} for placement in self.replicas),
        )

    @staticmethod
    def merge(pipelines: list[Program]) -> Program:
        """Replicas side by side (disjoint ranks) as one Program."""
        ops = {rank: list(rank_ops) for p in pipelines for rank, rank_ops in p.ops.items()}
        first = pipelines[0]
        return Program(
            ops,
            first.num_stages,
            first.num_microbatches,
            dict(first.stage_to_rank),
            tuple(dict(p.stage_to_rank) for p in pipelines),
        )

    def to_text(self) -> str:
        """All ops, one per line, grouped by rank (`rank 0:` headers); schedules.text.parse_program
        reads it back."""
        from clustersim.schedules.text import format_op  # the text form builds on this module

        lines = []
        for rank in self.ranks:
            lines.append(f"rank {rank}:")
            lines.extend(f"  {format_op(op)}" for op in self.ops[rank])
        return "\n".join(lines)
