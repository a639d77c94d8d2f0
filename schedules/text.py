"""The IR's text form (see schedules/ir.py's docstring): `format_op` writes one op per line and
`parse_op` reads it back, so programs print, diff and round-trip as text."""

from __future__ import annotations

import re

from clustersim.schedules.ir import (
    COLLECTIVE_KINDS,
    PIPELINE_PHASES,
    Collective,
    Comm,
    Compute,
    MessageTag,
    Op,
    Phase,
    Program,
    Recv,
    Send,
)
from clustersim.schedules.tags import parse_tag


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


_MICROBATCH_PHASES = "|".join(p for p in Phase if p != Phase.OPT)
_TAG = rf"(?P<phase>{'|'.join(PIPELINE_PHASES)})(?P<mb>\d+)@(?P<stage>\d+)"
_COMPUTE_RE = re.compile(
    rf"(?:(?P<phase>{_MICROBATCH_PHASES})(?P<mb>\d+)|(?P<opt>OPT))@(?P<stage>\d+)(?:\.(?P<part>\d+))?"
    r"(?: (?P<flops>\S+)FLOP)?(?: (?P<nbytes>\S+)B)?$"
)
_COLLECTIVE_RE = re.compile(r"(?P<kind>[A-Z_]+) (?P<tag>\S+) \[(?P<group>[\d,]+)\] (?P<nbytes>\S+)B (?P<algo>\S+)$")
_P2P_RE = re.compile(rf"(?P<kind>{Comm.SEND}|{Comm.RECV}) {_TAG} (?P<dir>->|<-)(?P<peer>\d+) (?P<nbytes>\S+)B$")


def parse_op(text: str) -> Op:
    """Inverse of `format_op`; raises ValueError naming the text it could not read."""
    stream, sep, rest = text.strip().partition(": ")
    if not sep:
        raise ValueError(f"op text {text!r}: expected 'stream: body'")
    body, _, after = rest.partition(" after ")
    deps = tuple(d.strip() for d in after.split(",")) if after else ()
    if m := _COMPUTE_RE.match(body):
        phase = Phase.OPT if m["opt"] else Phase(m["phase"])
        microbatch = None if m["opt"] else int(m["mb"])
        flops = float(m["flops"]) if m["flops"] else 0.0
        nbytes = float(m["nbytes"]) if m["nbytes"] else 0.0
        part = int(m["part"]) if m["part"] is not None else None
        return Compute(phase, microbatch, int(m["stage"]), flops, nbytes, stream, deps, part)
    if m := _P2P_RE.match(body):
        message = MessageTag(Phase(m["phase"]), int(m["mb"]), int(m["stage"]))
        cls = Send if m["kind"] == Comm.SEND else Recv
        if (cls is Send) != (m["dir"] == "->"):
            raise ValueError(f"op text {text!r}: SEND takes '->', RECV takes '<-'")
        return cls(int(m["peer"]), message, float(m["nbytes"]), stream, deps)
    if (m := _COLLECTIVE_RE.match(body)) and m["kind"].lower() in COLLECTIVE_KINDS:
        group = tuple(int(r) for r in m["group"].split(","))
        try:
            tag = parse_tag(m["tag"])
        except ValueError as exc:
            raise ValueError(f"op text {text!r}: {exc}") from None
        return Collective(m["kind"].lower(), tag, group, float(m["nbytes"]), m["algo"], stream, deps)
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
