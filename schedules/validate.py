"""Check a Program before it runs, and name the first broken rule with its rank, op index and label.

Rules, checked in this order:
  structure   labels unique per rank; every dep names an op of the same rank
  placement   a compute op runs on the rank that holds its stage
  coverage    every (F|B, microbatch, stage) exactly once, a W at most once (an op cut into pieces:
              pieces 0, 1, ... in order on one stream); one OPT per stage, after its B's and W's
  order       on a stage, a microbatch's F comes before its B, its B before its W (weight gradient)
  chains      F(mb, s) consumes F(mb, s-1)'s output, B(mb, s) consumes B(mb, s+1)'s: by a receive it
              depends on, or by an earlier op on the same stream when both stages share a rank
              (for an op in pieces: its first piece, waiting for the producer's last)
  p2p         a send goes to the rank that consumes it and after the op (its last piece) that produced it; every
              send has exactly one matching receive (peer, tag, bytes) and vice versa
  collectives every member of a collective's group runs it once, with the same kind, group and
              size; a rank is a member of the groups it runs
  deadlock    a dry run (eager sends, in-order streams) finishes every op (not with `dry_run` False:
              the engine about to walk the program raises DeadlockError naming each stuck stream's wait)
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable
from operator import attrgetter

from clustersim.schedules.ir import Collective, Compute, MessageTag, Op, Phase, Program, Recv, Send


class ProgramError(ValueError):
    """A schedule that cannot be right; the message names rank, op and rule."""


def _where(rank: int, index: int, op: Op) -> str:
    return f"rank {rank}, op {index} ({op.label})"


def _whole_label(op: Compute) -> str:
    """The label of the whole op a piece belongs to (the op's own label when it is whole)."""
    return op.label if op.part is None else op.label.rpartition(".")[0]


def _ends(ops: list[Op]) -> dict[str, str]:
    """Whole op label -> the label of its last piece (itself when whole), for a rank's ops."""
    return {op.label if op.part is None else op.label.rpartition(".")[0]: op.label for op in ops if type(op) is Compute}


def validate(
    program: Program, joins: Callable[[Collective], tuple[int, ...]] = attrgetter("group"), dry_run: bool = True
) -> None:
    """Raise ProgramError at the first broken rule (see the module docstring). `joins`: the ranks
    that must reach each collective (default: its whole group; a program that holds only some of
    the world's ranks says which of a group's members it holds)."""
    _check_structure(program)
    for pipeline in program.pipelines():
        _check_coverage_and_order(pipeline)
        _check_chains(pipeline, ends := {rank: _ends(pipeline.ops[rank]) for rank in pipeline.ranks})
        _check_p2p(pipeline, ends)
    _check_collectives(program, joins)
    if dry_run:
        _check_deadlock(program, joins)


def _check_structure(program: Program) -> None:
    for rank in program.ranks:
        ops = program.ops[rank]
        labels, seen = {op.label for op in ops}, set()
        for i, op in enumerate(ops if len(labels) < len(ops) else ()):  # (a label twice: the first one)
            if op.label in seen:
                raise ProgramError(f"{_where(rank, i, op)}: label used twice on this rank")
            seen.add(op.label)
        for i, op in enumerate(ops):
            if op.deps and not labels.issuperset(op.deps):
                dep = next(dep for dep in op.deps if dep not in labels)
                raise ProgramError(f"{_where(rank, i, op)}: depends on {dep!r}, which rank {rank} never runs")


def _check_coverage_and_order(program: Program) -> None:
    found: dict[tuple[Phase, int | None, int], tuple[int, int]] = {}
    counts: dict[str, int] = defaultdict(int)  # whole op label -> times run (its first piece counts)
    for rank in program.ranks:
        seen: dict[str, Op] = {}  # the rank's compute ops so far (a piece follows one), by label
        for i, op in enumerate(program.ops[rank]):
            if type(op) is not Compute:
                continue
            seen[op.label] = op
            if not op.part:
                counts[op.label if op.part is None else op.label.rpartition(".")[0]] += 1
            owner = program.stage_to_rank.get(op.stage)
            if owner != rank:
                raise ProgramError(f"{_where(rank, i, op)}: stage {op.stage} belongs to rank {owner}")
            key = (op.phase, op.microbatch, op.stage)
            if op.part is not None:
                _check_piece(rank, i, op, seen)
                if op.part > 0:
                    continue
            if op.microbatch is not None and not 0 <= op.microbatch < program.num_microbatches:
                raise ProgramError(f"{_where(rank, i, op)}: microbatch outside 0..{program.num_microbatches - 1}")
            if op.phase == Phase.B and (Phase.F, op.microbatch, op.stage) not in found:
                raise ProgramError(f"{_where(rank, i, op)}: backward before its forward")
            if op.phase == Phase.W and ((Phase.B, *key[1:]) not in found or (Phase.OPT, None, op.stage) in found):
                raise ProgramError(f"{_where(rank, i, op)}: W before its backward or after OPT@{op.stage}")
            if op.phase == Phase.OPT:
                missing = [mb for mb in range(program.num_microbatches) if (Phase.B, mb, op.stage) not in found]
                if missing:
                    raise ProgramError(
                        f"{_where(rank, i, op)}: optimizer step before backward B{missing[0]}@{op.stage}"
                    )
            found[key] = (rank, i)
    for stage in range(program.num_stages):
        for phase, mbs in (
            (Phase.F, range(program.num_microbatches)),
            (Phase.B, range(program.num_microbatches)),
            (Phase.OPT, [None]),
        ):
            for mb in mbs:
                if (phase, mb, stage) not in found:
                    label = f"OPT@{stage}" if mb is None else f"{phase}{mb}@{stage}"
                    raise ProgramError(f"rank {program.stage_to_rank.get(stage)}: {label} is never run")
    if all(count == 1 for count in counts.values()):
        return
    for rank in program.ranks:
        for i, op in enumerate(program.ops[rank]):
            if isinstance(op, Compute) and not op.part and counts[_whole_label(op)] > 1:
                raise ProgramError(f"{_where(rank, i, op)}: run more than once")


def _check_piece(rank: int, i: int, op: Compute, seen: dict[str, Op]) -> None:
    """Piece k > 0 follows piece k-1 of the same op on the same stream (with anything between);
    `seen`: the rank's ops before op i, by label."""
    if not op.part:
        return
    before = seen.get(f"{_whole_label(op)}.{op.part - 1}")
    if before is None or before.stream != op.stream:
        raise ProgramError(
            f"{_where(rank, i, op)}: piece {op.part} does not follow piece {op.part - 1} on stream {op.stream}"
        )


def _check_chains(program: Program, ends_of: dict[int, dict[str, str]]) -> None:
    for rank in program.ranks:
        ops, ends, index = program.ops[rank], ends_of[rank], None
        for i, op in enumerate(ops):
            if type(op) is not Compute or op.part or (op.phase != Phase.F and op.phase != Phase.B):
                continue  # OPT and W consume nothing from another stage
            src = op.stage - 1 if op.phase == Phase.F else op.stage + 1
            if not 0 <= src < program.num_stages:
                continue
            needed = f"{op.phase}{op.microbatch}@{src}"
            if program.stage_to_rank[src] == rank:
                index = index or {op.label: i for i, op in enumerate(ops)}
                j = index.get(ends.get(needed, needed))
                same_stream_before = j is not None and j < i and ops[j].stream == op.stream
                if not (same_stream_before or ends.get(needed, needed) in op.deps):
                    raise ProgramError(f"{_where(rank, i, op)}: runs before {needed}, whose output it consumes")
            elif f"RECV {needed}" not in op.deps:
                what = "activation" if op.phase == Phase.F else "gradient"
                raise ProgramError(
                    f"{_where(rank, i, op)}: does not wait for the {what} {needed} "
                    f"(needs a dependency on RECV {needed})"
                )


def _check_p2p(program: Program, ends_of: dict[int, dict[str, str]]) -> None:
    recvs: dict[tuple[int, int, MessageTag], tuple[int, Recv]] = {}
    for rank in program.ranks:
        for i, op in enumerate(program.ops[rank]):
            if type(op) is Recv:
                recvs[(op.peer, rank, op.tag)] = (i, op)
    matched = set()
    for rank in program.ranks:
        ends = ends_of[rank]
        for i, op in enumerate(program.ops[rank]):
            if type(op) is not Send:
                continue
            phase, mb, stage = op.tag
            if program.stage_to_rank.get(stage) != rank:
                raise ProgramError(
                    f"{_where(rank, i, op)}: sends the output of stage {stage}, which rank {rank} does not hold"
                )
            consumer = stage + 1 if phase == Phase.F else stage - 1
            expected = program.stage_to_rank.get(consumer)
            if op.peer != expected:
                raise ProgramError(
                    f"{_where(rank, i, op)}: sends to rank {op.peer}, but stage {consumer} that "
                    f"consumes {phase}{mb}@{stage} is on rank {expected}"
                )
            producer = f"{phase}{mb}@{stage}"
            producer = ends.get(producer, producer)
            if producer not in op.deps:
                raise ProgramError(f"{_where(rank, i, op)}: does not wait for {producer}, which produces what it sends")
            key = (rank, op.peer, op.tag)
            if key not in recvs:
                raise ProgramError(f"{_where(rank, i, op)}: rank {op.peer} never receives it")
            j, recv = recvs[key]
            if recv.nbytes != op.nbytes:
                raise ProgramError(
                    f"{_where(rank, i, op)}: sends {op.nbytes!r} B but rank {op.peer} op {j} receives {recv.nbytes!r} B"
                )
            matched.add(key)
    unmatched = [] if len(matched) == len(recvs) else sorted(recvs.items(), key=lambda kv: (kv[0][1], kv[1][0]))
    for (src, dst, _), (j, recv) in unmatched:  # (the receives in rank and op order)
        if (src, dst, recv.tag) not in matched:
            raise ProgramError(f"{_where(dst, j, recv)}: rank {src} never sends it")


def _check_collectives(program: Program, joins: Callable[[Collective], tuple[int, ...]]) -> None:
    seen: dict[str, dict[int, tuple[int, Collective]]] = {}  # tag text -> members
    for rank in program.ranks:
        for i, op in enumerate(program.ops[rank]):
            if type(op) is Collective:
                if rank not in op.group:
                    raise ProgramError(f"{_where(rank, i, op)}: rank {rank} is not in its group {list(op.group)}")
                seen.setdefault(op.tag.text, {})[rank] = (i, op)
    for members in seen.values():
        first_rank, (_, first) = next(iter(members.items()))
        for rank in joins(first):
            if rank not in members:
                i, op = members[first_rank]
                raise ProgramError(f"{_where(first_rank, i, op)}: member rank {rank} never joins it")
            i, op = members[rank]
            if op is not first and (op.kind, op.group, op.nbytes) != (first.kind, first.group, first.nbytes):
                raise ProgramError(
                    f"{_where(rank, i, op)}: differs from rank {first_rank}'s {first.label} "
                    f"({op.kind} {list(op.group)} {op.nbytes!r} B vs {first.kind} "
                    f"{list(first.group)} {first.nbytes!r} B)"
                )


def _check_deadlock(program: Program, joins: Callable[[Collective], tuple[int, ...]]) -> None:
    """Dry run: each stream walks its ops in order; an op finishes once its deps have finished (a receive
    also once its matching send has finished, a collective once every member has reached it). Stuck
    streams are a deadlock. Streams wait on what blocks them and are woken then: linear in the ops."""
    streams: dict[tuple[int, str], list[Op]] = defaultdict(list)
    for rank in program.ranks:
        for op in program.ops[rank]:
            streams[(rank, op.stream)].append(op)
    done: dict[int, set[str]] = {rank: set() for rank in program.ranks}  # rank -> labels finished
    sent: set[tuple[int, int, MessageTag]] = set()
    joined: dict[str, set[int]] = defaultdict(set)  # collective tag text -> members that reached it
    pos = dict.fromkeys(streams, 0)
    sleepers: dict[tuple, list[tuple[int, str]]] = defaultdict(list)  # what blocks -> streams waiting on it
    # rank -> label -> streams waiting for that op to finish (kept apart: checked after every op)
    waiting: dict[int, dict[str, list[tuple[int, str]]]] = {rank: {} for rank in program.ranks}
    ready = deque(streams)
    members = joins
    while ready:
        key = ready.popleft()
        rank, ops, mine, on_mine = key[0], streams[key], done[key[0]], waiting[key[0]]
        i = pos[key]
        while i < len(ops):
            op = ops[i]
            for dep in op.deps:
                if dep not in mine:
                    break
            else:
                dep = None
            if dep is not None:
                on_mine.setdefault(dep, []).append(key)
                break
            if type(op) is Collective:
                group = joined[op.tag.text]
                if rank not in group:
                    group.add(rank)
                    if len(group) == len(members(op)):
                        ready.extend(sleepers.pop(("joined", op.tag.text), ()))
                if len(group) < len(members(op)):
                    sleepers[("joined", op.tag.text)].append(key)
                    break
            elif type(op) is Recv and (op.peer, rank, op.tag) not in sent:
                sleepers[("sent", op.peer, rank, op.tag)].append(key)
                break
            mine.add(op.label)
            if on_mine and op.label in on_mine:
                ready.extend(on_mine.pop(op.label))
            if type(op) is Send:
                sent.add((rank, op.peer, op.tag))
                if sleepers:
                    ready.extend(sleepers.pop(("sent", rank, op.peer, op.tag), ()))
            i += 1
        pos[key] = i
    stuck = [(key, pos[key], ops[pos[key]]) for key, ops in streams.items() if pos[key] < len(ops)]
    if stuck:
        index = {(rank, op.label): i for rank in program.ranks for i, op in enumerate(program.ops[rank])}
        waits = "; ".join(
            f"{_where(rank, index[(rank, op.label)], op)} on stream {stream} waits for "
            f"{_blocker(op, done[rank], joined, joins)}"
            for (rank, stream), _, op in sorted(stuck, key=lambda s: s[0])
        )
        raise ProgramError(f"deadlock: {waits}")


def _blocker(op: Op, done: set[str], joined: dict, joins: Callable[[Collective], tuple[int, ...]]) -> str:
    """What `op` waits for, in words."""
    for dep in op.deps:
        if dep not in done:
            return dep
    if isinstance(op, Collective) and len(joined[op.tag.text]) < len(joins(op)):
        missing = [r for r in joins(op) if r not in joined[op.tag.text]]
        return f"ranks {', '.join(map(str, missing))} to join {op.label}"
    return f"SEND {op.label[5:]} on rank {op.peer}" if isinstance(op, Recv) else "nothing it names"
