"""ZeRO 3 as FSDP runs it: a stage's weights sharded over the data-parallel group and gathered one
unit (by default one decoder layer) at a time, the next unit's gather in flight while the current
one computes, each unit freed after use and its gradients reduce-scattered as soon as they are
final.

The stage ops arrive cut into pieces where each unit starts (tp_stage_plan with `unit_layers`:
a forward runs units 0..U-1, a backward U-1..0). On each rank the units used by its forwards
and backwards form one sequence u_0, u_1, ... in compute order. Gather j, all_gather of unit
u_j's weights on the "dp" stream, waits for the end of use j - P - 1 (P = `prefetch`, FSDP's
forward/backward prefetch of one unit: P = 1), so at most P + 1 gathered units exist at once:

    peak weights = 2 Psi / N  +  max over P + 1 consecutive uses of their units' bytes

(2 Psi / N: the rank's shard; equal units of w bytes: 2 Psi / N + (P + 1) w). Gather j + P is
issued when use j starts, before use j's gradient reduce-scatter, as FSDP issues its prefetch.
After a stage's last gradient op (its last backward, or W when a zero-bubble schedule splits it
off), each unit's gradients are reduce-scattered as one collective (FSDP's flat parameter per
unit) as soon as that unit's part of the op has finished, so reducing one unit overlaps the
backward of the next (where a tensor-parallel sum of partial gradients must come first, under
sequence parallelism or with MoE layers, all of them after it). Gathers and reduce-scatters
share the "dp" stream in the order FSDP issues them to its process group (one NCCL communicator
runs its collectives in issue order). With N ranks in the group, m microbatches and Psi the
stage's 16-bit weight bytes, a step sends

    all_gather (N-1)/N Psi per forward and per backward, reduce_scatter (N-1)/N Psi once:
    3 (N-1)/N Psi for one microbatch, (2m + 1)(N-1)/N Psi for m

(Rajbhandari et al. 2020, section 7: 1.5x data parallelism's 2 (N-1)/N Psi). Gradients are
summed over the microbatches before the one reduce-scatter per unit (FSDP's no_sync
accumulation).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple

from clustersim.schedules.ir import DP_STREAM, GRADIENT_PHASES, PIPELINE_PHASES, Collective, Compute, Op, Phase, Program
from clustersim.schedules.layout import Layout
from clustersim.schedules.tags import GradBucket, ParamGather

STREAM = DP_STREAM  # gathers and reduce-scatters, in the order FSDP issues them to its process group
UnitStarts = Callable[[Phase, int, bool], tuple[int, ...]]  # (phase, stage, split B) -> piece of each unit


class _Use(NamedTuple):
    """One unit's weights used by one forward or backward: from its first piece to its last."""

    stage: int
    unit: int
    first: str  # label of the piece it starts in
    last: str  # label of its last piece
    done: str = ""  # label of the piece its work ends in (`unit_uses`)


def add_zero3(
    program: Program,
    layout: Layout,
    unit_bytes: Callable[[int, int], float],
    unit_starts: UnitStarts,
    prefetch: int = 1,
    grad_scale: float = 1.0,
) -> Program:
    """The program with each stage's per-unit weight gathers and gradient reduce-scatters (module
    docstring), and its optimizer step on the rank's 1/N of the state after them.

    `unit_bytes(stage, unit)`: a unit's 16-bit weight bytes on one rank (= its gradients').
    `unit_starts(phase, stage, split)`: the piece each unit of such an op starts in, in the op's
    order (stage_pieces.unit_starts); a whole op (not cut) is one unit. `grad_scale`: a gradient's
    bytes per weight byte (2: FP32 gradients), what each reduce-scatter moves.
    """
    if prefetch < 0:
        raise ValueError(f"ZeRO-3 prefetch must be >= 0 units, got {prefetch}")
    ops: dict[int, list[Op]] = {}
    gather_tag, grads_tag = functools.cache(ParamGather), functools.cache(GradBucket)
    for rank in program.ranks:
        d, p, t = layout.coords(rank)
        group = layout.dp_group(p, t)
        rank_ops = program.ops[rank]
        uses = unit_uses(rank_ops, unit_starts)
        at_start = {use.first: j for j, use in enumerate(uses)}
        reduce_after = {label: [unit for _, unit in done] for label, done in final_units(rank_ops, uses).items()}
        gathers: list[str] = []  # labels of the gathers issued so far, use by use
        reduced: dict[int, list[str]] = {}  # stage -> labels of its reduce-scatters
        out: list[Op] = []

        def gather(j: int, rank_uses=uses, group=group, t=t, out=out, gathers=gathers) -> None:
            use = rank_uses[j]
            after = (rank_uses[j - prefetch - 1].last,) if j > prefetch else ()
            tag = gather_tag(use.stage, t, use.unit, use.first)
            out.append(Collective("all_gather", tag, group, unit_bytes(use.stage, use.unit), stream=STREAM, deps=after))
            gathers.append(out[-1].label)

        for op in rank_ops:
            if isinstance(op, Compute) and op.label in at_start:
                j = at_start[op.label]
                while len(gathers) <= min(j + prefetch, len(uses) - 1):
                    gather(len(gathers))
                op = dataclasses.replace(op, deps=op.deps + (gathers[j],))
            if isinstance(op, Compute) and op.phase == Phase.OPT:
                op = dataclasses.replace(
                    op,
                    nbytes=op.nbytes / layout.dp,
                    flops=op.flops / layout.dp,
                    deps=op.deps + tuple(reduced[op.stage]),
                )
            out.append(op)
            if not isinstance(op, Compute):
                continue
            for unit in reduce_after.get(op.label, ()):
                reduce = Collective(
                    "reduce_scatter",
                    grads_tag(op.stage, t, unit),
                    group,
                    unit_bytes(op.stage, unit) * grad_scale,
                    stream=STREAM,
                    deps=(op.label,),
                )
                out.append(reduce)
                reduced.setdefault(op.stage, []).append(reduce.label)
        ops[rank] = out
    return dataclasses.replace(program, ops=ops)


def unit_ranges(layers: range, unit_layers: int | None) -> list[range]:
    """The layers of each unit of a stage holding `layers`, in order: units of `unit_layers`
    layers, the last one shorter when that does not divide them (None: one unit, the stage)."""
    if unit_layers is not None and unit_layers < 1:
        raise ValueError(f"a ZeRO-3 unit holds at least one layer, not {unit_layers}")
    size = unit_layers or max(1, len(layers))
    return [layers[i : i + size] for i in range(0, len(layers), size)] or [layers]


def final_units(rank_ops: list[Op], uses: list[_Use]) -> dict[str, list[tuple[int, int]]]:
    """label -> the (stage, unit)s whose gradients are final once that op (piece) ends, in the
    order they become so: each unit's part of its stage's last gradient op (a W is whole: every
    unit after it). Not later under tensor parallelism: Megatron-LM sums the replicated
    parameters' gradients over the tensor-parallel group after the data-parallel reduction
    (megatron/core/distributed/finalize_model_grads.py: finish_grad_sync, then
    _allreduce_layernorm_grads; the 2022 training.py in the same order), and a sum's order does
    not change it."""
    computes = [op for op in rank_ops if isinstance(op, Compute)]
    last_gradient_op = {op.stage: _whole(op) for op in computes if op.phase in GRADIENT_PHASES}
    done: dict[str, list[tuple[int, int]]] = {}
    for use in uses:
        if _whole_label(use.first) == last_gradient_op[use.stage]:
            done.setdefault(use.done, []).append((use.stage, use.unit))
    for w in computes:
        if w.phase == Phase.W and _whole(w) == last_gradient_op[w.stage]:
            done.setdefault(w.label, []).extend((w.stage, u) for u in reversed(range(_unit_count(uses, w.stage))))
    return done


def unit_buckets(unit_bytes: list[float], bucket_bytes: float) -> list[range]:
    """Gradient buckets of whole units, as Megatron-LM's param_and_grad_buffer forms them: units
    taken last to first (the order the backward finishes them) until a bucket holds at least
    `bucket_bytes`; returned first to last."""
    buckets: list[range] = []
    end, held = len(unit_bytes), 0.0
    for unit in reversed(range(len(unit_bytes))):
        held += unit_bytes[unit]
        if held >= bucket_bytes or unit == 0:
            buckets.append(range(unit, end))
            end, held = unit, 0.0
    return buckets[::-1]


def unit_uses(rank_ops: list[Op], unit_starts: UnitStarts) -> list[_Use]:
    """The units a rank's forwards and backwards use, in compute order. A unit whose last piece
    ends at a tensor-parallel collective, or whose next unit's first piece waits for one (an
    overlapped reduce-scatter, schedules.tp_overlap), finishes its work (its row-parallel bias, the
    layernorm behind the collective) in the next unit's first piece: its `done`; else its last."""
    split = {(op.microbatch, op.stage) for op in rank_ops if isinstance(op, Compute) and op.phase == Phase.W}
    uses: list[_Use] = []
    last_piece = ""
    for op in rank_ops:
        if not (isinstance(op, Compute) and op.phase in PIPELINE_PHASES):
            continue
        starts: tuple[int, ...] = (0,)
        if op.part is None:
            position = 0
        else:
            starts = unit_starts(op.phase, op.stage, (op.microbatch, op.stage) in split)
            position = starts.index(op.part) if op.part in starts else -1
        if position >= 0:
            if uses:
                uses[-1] = uses[-1]._replace(last=last_piece)
            unit = position if op.phase == Phase.F else len(starts) - 1 - position
            uses.append(_Use(op.stage, unit, op.label, op.label))
        last_piece = op.label
    if uses:
        uses[-1] = uses[-1]._replace(last=last_piece)
    collectives = {op.label: op.deps for op in rank_ops if isinstance(op, Collective)}
    ended_by_collective = {dep for deps in collectives.values() for dep in deps}
    waits = {op.label for op in rank_ops if isinstance(op, Compute) and any(d in collectives for d in op.deps)}
    spills = [
        after is not None
        and (use.last in ended_by_collective or after.first in waits)
        and _whole_label(after.first) == _whole_label(use.first)
        for use, after in zip(uses, [*uses[1:], None])
    ]
    return [
        use._replace(done=uses[j + 1].first if spill else use.last) for j, (use, spill) in enumerate(zip(uses, spills))
    ]


def _unit_count(uses: list[_Use], stage: int) -> int:
    return 1 + max(use.unit for use in uses if use.stage == stage)


def _whole_label(label: str) -> str:
    """A piece's op ("B3@1.2" -> "B3@1"); a whole op's label is its own."""
    head, _, tail = label.rpartition(".")
    return head if head and tail.isdigit() else label


def _whole(op: Compute) -> str:
    return _whole_label(op.label)
