"""The op IR: what one rank does, one op at a time, on named streams.

Ops on one stream run in order, like a CUDA stream; `deps` name ops (by label) on other streams
of the same rank that must finish first, like CUDA events. Every op has a one-line text form
that round-trips through `parse_op`:

    compute: F3@1                      forward of microbatch 3 on global pipeline stage 1
    compute: F3@1.2 after ALL_REDUCE tp@d0.F3@1.1   its third piece, cut at tensor-parallel collectives
    compute: B3@1 after RECV B3@2      backward, waits for the gradient from stage 2
    compute: OPT@1 4.2e+10B            optimizer step of stage 1's parameters, touching 42 GB
    send: SEND F3@1 ->2 4096B after F3@1
    recv: RECV F3@0 <-0 4096B
    dp: ALL_REDUCE grads@1.b0 [1,5] 1048576B ring after B7@1

A message's tag is (phase, microbatch, producer stage), so `SEND F3@1` on one rank matches
`RECV F3@1` on its peer. A collective's tag names it on every member of its group (the ranks in
brackets, in the group's order); its size means what it means in nccl-tests. Labels are unique within a rank; each op computes its label once, at construction.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

PHASES = ("F", "B", "OPT")
COMPUTE_STREAM = "compute"
SEND_STREAM = "send"
RECV_STREAM = "recv"

Tag = tuple[str, int, int]  # (phase "F"|"B", microbatch, producer stage)


@dataclass(frozen=True, slots=True)
class Compute:
    """Forward (F), backward (B) or optimizer step (OPT) of one stage's layers for one microbatch.

    `part` numbers the pieces of a forward or backward that tensor parallelism cuts at its
    collectives (label F3@1.0, F3@1.1, ...; None: the op is whole). The pieces of one op run in
    order on one stream; the first waits for what the whole op waits for, and whoever uses the
    op's result waits for the last."""

    phase: str
    microbatch: int | None
    stage: int
    flops: float = 0.0
    nbytes: float = 0.0  # memory traffic, for memory-bound ops such as the optimizer step
    stream: str = COMPUTE_STREAM
    deps: tuple[str, ...] = ()
    part: int | None = None
    label: str = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        label = f"OPT@{self.stage}" if self.phase == "OPT" else f"{self.phase}{self.microbatch}@{self.stage}"
        object.__setattr__(self, "label", label if self.part is None else f"{label}.{self.part}")


@dataclass(frozen=True, slots=True)
class _PointToPoint:
    """A message with `peer`, tagged `tag`, of `nbytes`; the subclass says which end it is."""

    peer: int
    tag: Tag
    nbytes: float
    stream: str
    deps: tuple[str, ...] = ()
    label: str = field(init=False, repr=False, compare=False)
    KIND = ""

    def __post_init__(self):
        object.__setattr__(self, "label", f"{self.KIND} {_tag_text(self.tag)}")


@dataclass(frozen=True, slots=True)
class Send(_PointToPoint):
    """Point-to-point send of the tensor tagged `tag` to rank `peer` (eager: buffered at the peer)."""

    stream: str = SEND_STREAM
    KIND = "SEND"


@dataclass(frozen=True, slots=True)
class Recv(_PointToPoint):
    """Point-to-point receive of the tensor tagged `tag` from rank `peer`; done when it arrives."""

    stream: str = RECV_STREAM
    KIND = "RECV"


COLLECTIVE_KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")


@dataclass(frozen=True, slots=True)
class Collective:
    """One rank's part in a collective over `group` (ranks); every member has the same tag."""

    kind: str
    tag: str
    group: tuple[int, ...]
    nbytes: float
    algorithm: str = "auto"
    stream: str = "dp"
    deps: tuple[str, ...] = ()
    label: str = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "label", f"{self.kind.upper()} {self.tag}")


Op = Compute | Send | Recv | Collective


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
                return dataclasses.replace(op, peer=new_rank[op.peer])
            if isinstance(op, Collective):
                return dataclasses.replace(op, group=tuple(new_rank[r] for r in op.group))
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
        """All ops, one per line, grouped by rank (`rank 0:` headers); `Program.parse` reads it back."""
        lines = []
        for rank in self.ranks:
            lines.append(f"rank {rank}:")
            lines.extend(f"  {format_op(op)}" for op in self.ops[rank])
        return "\n".join(lines)


def _tag_text(tag: Tag) -> str:
    phase, microbatch, stage = tag
    return f"{phase}{microbatch}@{stage}"


def _flops_text(flops: float) -> str:
    return f" {flops!r}FLOP" if flops else ""


def format_op(op: Op) -> str:
    """The one-line text form of an op (see the module docstring)."""
    if isinstance(op, Compute):
        body = op.label + _flops_text(op.flops) + (f" {op.nbytes!r}B" if op.nbytes else "")
    elif isinstance(op, Collective):
        body = f"{op.label} [{','.join(map(str, op.group))}] {op.nbytes!r}B {op.algorithm}"
    elif isinstance(op, Send):
        body = f"{op.label} ->{op.peer} {op.nbytes!r}B"
    else:
        body = f"{op.label} <-{op.peer} {op.nbytes!r}B"
    after = f" after {', '.join(op.deps)}" if op.deps else ""
    return f"{op.stream}: {body}{after}"


_TAG = r"(?P<phase>F|B)(?P<mb>\d+)@(?P<stage>\d+)"
_COMPUTE_RE = re.compile(
    r"(?:(?P<phase>F|B)(?P<mb>\d+)|(?P<opt>OPT))@(?P<stage>\d+)(?:\.(?P<part>\d+))?"
    r"(?: (?P<flops>\S+)FLOP)?(?: (?P<nbytes>\S+)B)?$"
)
_COLLECTIVE_RE = re.compile(r"(?P<kind>[A-Z_]+) (?P<tag>\S+) \[(?P<group>[\d,]+)\] (?P<nbytes>\S+)B (?P<algo>\S+)$")
_P2P_RE = re.compile(rf"(?P<kind>SEND|RECV) {_TAG} (?P<dir>->|<-)(?P<peer>\d+) (?P<nbytes>\S+)B$")


def parse_op(text: str) -> Op:
    """Inverse of `format_op`; raises ValueError naming the text it could not read."""
    stream, sep, rest = text.strip().partition(": ")
    if not sep:
        raise ValueError(f"op text {text!r}: expected 'stream: body'")
    body, _, after = rest.partition(" after ")
    deps = tuple(d.strip() for d in after.split(",")) if after else ()
    if m := _COMPUTE_RE.match(body):
        phase = "OPT" if m["opt"] else m["phase"]
        microbatch = None if m["opt"] else int(m["mb"])
        flops = float(m["flops"]) if m["flops"] else 0.0
        nbytes = float(m["nbytes"]) if m["nbytes"] else 0.0
        part = int(m["part"]) if m["part"] is not None else None
        return Compute(phase, microbatch, int(m["stage"]), flops, nbytes, stream, deps, part)
    if m := _P2P_RE.match(body):
        tag = (m["phase"], int(m["mb"]), int(m["stage"]))
        cls = Send if m["kind"] == "SEND" else Recv
        if (cls is Send) != (m["dir"] == "->"):
            raise ValueError(f"op text {text!r}: SEND takes '->', RECV takes '<-'")
        return cls(int(m["peer"]), tag, float(m["nbytes"]), stream, deps)
    if (m := _COLLECTIVE_RE.match(body)) and m["kind"].lower() in COLLECTIVE_KINDS:
        group = tuple(int(r) for r in m["group"].split(","))
        return Collective(m["kind"].lower(), m["tag"], group, float(m["nbytes"]), m["algo"], stream, deps)
    raise ValueError(f"op text {text!r}: not a compute, send, recv or collective op")


def parse_program(text: str, num_stages: int, num_microbatches: int, stage_to_rank: dict[int, int]) -> Program:
    """Read `Program.to_text()` output back."""
    ops: dict[int, list[Op]] = {}
    current = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if m := re.match(r"rank (\d+):$", line.strip()):
            current = ops.setdefault(int(m[1]), [])
        elif current is None:
            raise ValueError(f"program text: op {line.strip()!r} before any 'rank N:' header")
        else:
            current.append(parse_op(line))
    return Program(ops, num_stages, num_microbatches, dict(stage_to_rank))
