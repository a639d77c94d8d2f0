"""Collective tags: the name a collective has on every member of its group, as fields.

A tag says which collective an op is (members meet by tag) and what it carries, so whoever acts
on a collective (the numerics, a report) reads the fields; `str(tag)` is the text form in the
op text and the trace, and `parse_tag` reads it back (the IR's round trip, nothing else).

    GradBucket   grads@1.t0.b3        bucket 3 of stage 1's dense gradients, tensor-parallel rank 0
                 egrads@1.t0.r1.b3    the same for the experts of expert-parallel rank 1
    ParamBucket  params@1.t0.b3       the weights of that bucket, gathered after a ZeRO 1/2 step
                 eparams@1.t0.r1.b3
    ParamGather  params@1.t0.u2.F3@1.4  ZeRO 3: unit 2 of stage 1's weights, gathered for the piece
                                      F3@1.4 its work starts in (schedules.zero3)
    TensorPiece  tp@d0.F3@1.2         the tensor-parallel collective ending piece F3@1.2 (replica 0)
    ChunkTail    tp@d0.tail.F3@1.3    the last chunk of a pipelined reduce-scatter, ending piece
                                      F3@1.3 (schedules.tp_overlap): its bytes, not its data
    ExpertPiece  ep@p1.t0.g0.F3@1.2   the expert-parallel all-to-all ending it (stage rank 1,
                                      tensor-parallel rank 0, expert-parallel group 0)
    GradSync     tp@d0.grads@1        the tensor-parallel sum of stage 1's partial gradients
    StageInput   tp@d0.in.F3@1        the tensor-parallel gather of the chunks of message F3@1 each
                                      rank received (Megatron's scatter/gather of pipeline sends)
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar


@dataclass(frozen=True, slots=True, eq=False)
class _Tag(ABC):
    """A tag's text, made once: every member of a group looks its collective up by tag, so
    equality and hash go by the text (which names the tag uniquely: `parse_tag` reads it back)."""

    text: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", self._format())

    @abstractmethod
    def _format(self) -> str:
        """The tag's text (each kind of tag says how it reads)."""

    def __str__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


@dataclass(frozen=True, slots=True, eq=False)  # equality and hash by text (_Tag)
class _Bucket(_Tag):
    """Bucket `bucket` of a stage's gradient set: `expert_rank` names the routed experts' set of
    that expert-parallel rank (ep > 1), None the set of every other parameter."""

    stage: int
    tp_rank: int
    bucket: int
    expert_rank: int | None = None
    PREFIX: ClassVar[str] = ""

    @property
    def gradient_set(self) -> str:
        """ "grads" or "egrads": which of a stage's two flat gradient vectors the bucket cuts."""
        return "grads" if self.expert_rank is None else "egrads"

    def _format(self) -> str:
        if self.expert_rank is None:
            return f"{self.PREFIX}@{self.stage}.t{self.tp_rank}.b{self.bucket}"
        return f"e{self.PREFIX}@{self.stage}.t{self.tp_rank}.r{self.expert_rank}.b{self.bucket}"


@dataclass(frozen=True, slots=True, eq=False)  # equality and hash by text (_Tag)
class GradBucket(_Bucket):
    """A bucket of gradients, reduced (all-reduce, or reduce-scatter under ZeRO)."""

    PREFIX: ClassVar[str] = "grads"


@dataclass(frozen=True, slots=True, eq=False)  # equality and hash by text (_Tag)
class ParamBucket(_Bucket):
    """The weights of a gradient bucket, gathered after a sharded (ZeRO 1, 2) optimizer step."""

    PREFIX: ClassVar[str] = "params"

    @staticmethod
    def of(grads: GradBucket) -> ParamBucket:
        return ParamBucket(grads.stage, grads.tp_rank, grads.bucket, grads.expert_rank)


@dataclass(frozen=True, slots=True, eq=False)  # equality and hash by text (_Tag)
class ParamGather(_Tag):
    """ZeRO 3: the (dense) weights of unit `unit` of a stage, gathered for the op piece labelled
    `consumer`, where that unit's work starts."""

    stage: int
    tp_rank: int
    unit: int
    consumer: str
    gradient_set: ClassVar[str] = "grads"  # ZeRO 3 shards dense weights only

    def _format(self) -> str:
        return f"params@{self.stage}.t{self.tp_rank}.u{self.unit}.{self.consumer}"


@dataclass(frozen=True, slots=True, eq=False)  # equality and hash by text (_Tag)
class TensorPiece(_Tag):
    """The tensor-parallel collective of data-parallel replica `replica` ending piece `piece`."""

    replica: int
    piece: str

    def _format(self) -> str:
        return f"tp@d{self.replica}.{self.piece}"


@dataclass(frozen=True, slots=True, eq=False)  # equality and hash by text (_Tag)
class ChunkTail(_Tag):
    """The last chunk of a pipelined reduce-scatter (schedules.tp_overlap), ending piece `piece`:
    the collective before it carries the whole result, this one the time of the chunk sent after
    the GEMM."""

    replica: int
    piece: str

    def _format(self) -> str:
        return f"tp@d{self.replica}.tail.{self.piece}"


@dataclass(frozen=True, slots=True, eq=False)  # equality and hash by text (_Tag)
class ExpertPiece(_Tag):
    """The expert-parallel all-to-all ending piece `piece` in expert-parallel group `group`."""

    pipeline_rank: int
    tp_rank: int
    group: int
    piece: str

    def _format(self) -> str:
        return f"ep@p{self.pipeline_rank}.t{self.tp_rank}.g{self.group}.{self.piece}"


@dataclass(frozen=True, slots=True, eq=False)  # equality and hash by text (_Tag)
class GradSync(_Tag):
    """The tensor-parallel sum of a stage's partial gradients before its optimizer step."""

    replica: int
    stage: int

    def _format(self) -> str:
        return f"tp@d{self.replica}.grads@{self.stage}"


@dataclass(frozen=True, slots=True, eq=False)  # equality and hash by text (_Tag)
class StageInput(_Tag):
    """The all-gather, over the tensor-parallel group of replica `replica`, of the 1/t chunks of
    the pipeline message (phase, microbatch, stage) its ranks received."""

    replica: int
    phase: str
    microbatch: int
    stage: int

    def _format(self) -> str:
        return f"tp@d{self.replica}.in.{self.phase}{self.microbatch}@{self.stage}"


CollectiveTag = GradBucket | ParamBucket | ParamGather | TensorPiece | ChunkTail | ExpertPiece | GradSync | StageInput

_BUCKET = re.compile(r"(?P<e>e?)(?P<what>grads|params)@(?P<stage>\d+)\.t(?P<t>\d+)(?:\.r(?P<r>\d+))?\.b(?P<b>\d+)$")
_GATHER = re.compile(r"params@(?P<stage>\d+)\.t(?P<t>\d+)\.u(?P<u>\d+)\.(?P<op>.+)$")
_SYNC = re.compile(r"tp@d(?P<d>\d+)\.grads@(?P<stage>\d+)$")
_INPUT = re.compile(r"tp@d(?P<d>\d+)\.in\.(?P<phase>[FB])(?P<mb>\d+)@(?P<stage>\d+)$")
_TAIL = re.compile(r"tp@d(?P<d>\d+)\.tail\.(?P<piece>.+)$")
_TENSOR = re.compile(r"tp@d(?P<d>\d+)\.(?P<piece>.+)$")
_EXPERT = re.compile(r"ep@p(?P<p>\d+)\.t(?P<t>\d+)\.g(?P<g>\d+)\.(?P<piece>.+)$")


def parse_tag(text: str) -> CollectiveTag:
    """Inverse of `str(tag)`; raises ValueError naming the text it could not read."""
    if m := _BUCKET.match(text):
        if bool(m["e"]) != (m["r"] is not None):
            raise ValueError(f"collective tag {text!r}: an expert bucket (e...) and only it names its expert rank")
        cls = GradBucket if m["what"] == "grads" else ParamBucket
        return cls(int(m["stage"]), int(m["t"]), int(m["b"]), int(m["r"]) if m["r"] is not None else None)
    if m := _GATHER.match(text):
        return ParamGather(int(m["stage"]), int(m["t"]), int(m["u"]), m["op"])
    if m := _SYNC.match(text):
        return GradSync(int(m["d"]), int(m["stage"]))
    if m := _INPUT.match(text):
        return StageInput(int(m["d"]), m["phase"], int(m["mb"]), int(m["stage"]))
    if m := _TAIL.match(text):
        return ChunkTail(int(m["d"]), m["piece"])
    if m := _TENSOR.match(text):
        return TensorPiece(int(m["d"]), m["piece"])
    if m := _EXPERT.match(text):
        return ExpertPiece(int(m["p"]), int(m["t"]), int(m["g"]), m["piece"])
    raise ValueError(f"collective tag {text!r}: not a gradient, parameter, tensor- or expert-parallel tag")
