"""Data parallelism and ZeRO as a pass over a pipeline Program: the gradient and parameter
collectives of each stage, on each rank's "dp" stream so they overlap compute.

Gradients of a stage are reduced in buckets of at most `bucket_bytes`, each bucket's collective
starting as soon as the stage's last backward has produced its gradients. With N = dp ranks in
a data-parallel group and Psi the bytes of a stage's 16-bit gradients (= its 16-bit weights):

    zero 0   all_reduce(grads) per bucket; optimizer step on everything     sends 2(N-1)/N Psi
    zero 1   reduce_scatter(grads) per bucket; optimizer step on 1/N of the  sends 2(N-1)/N Psi
             state; all_gather(weights) per bucket after the step
    zero 2   as zero 1 (gradients are also kept sharded: a memory change only)
    zero 3   weights sharded too, gathered one unit (FSDP's wrapping unit,   sends 3(N-1)/N Psi
             `unit_layers` layers) at a time before its part of every        (one microbatch)
             forward and backward, one unit prefetched; reduce_scatter(grads)
             per unit as its part of the last backward ends (schedules.zero3)

(Rajbhandari et al. 2020, ZeRO, section 7: stages 1 and 2 move what all-reduce moves, stage 3
1.5x.) With m microbatches stage 3 gathers every unit 2m times: (2m + 1)(N-1)/N Psi a step; at
most prefetch + 1 gathered units exist at once on a rank (schedules.zero3). With `overlap`
(Megatron-LM's overlap_grad_reduce) stages 0-2 bucket by whole layers instead and start each
bucket inside the last backward; the bytes are the same. With `overlap_param_gather` as well
(stages 1, 2) each bucket's weights are gathered one bucket ahead of the next step's forward, the
first after its stage's optimizer step (schedules.param_gather); again the same bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

from clustersim.schedules.ir import DP_STREAM, GRADIENT_PHASES, Collective, Comm, Compute, Op, Phase, Program
from clustersim.schedules.layout import Layout
from clustersim.schedules.param_gather import first_forward_uses
from clustersim.schedules.tags import GradBucket, GradSync, ParamBucket
from clustersim.schedules.zero3 import UnitStarts, add_zero3, final_units, unit_buckets, unit_uses

ZERO_STAGES = (0, 1, 2, 3)


def bucket_sizes(total_bytes: float, bucket_bytes: float) -> list[float]:
    """Split `total_bytes` into ceil(total / bucket) buckets, all full but the last (one, of
    everything, when the bucket is unbounded: math.inf)."""
    count = max(1, math.ceil(total_bytes / bucket_bytes))
    return [min(bucket_bytes, total_bytes - i * bucket_bytes) for i in range(count)] if count > 1 else [total_bytes]


def add_data_parallel(
    program: Program,
    layout: Layout,
    weight_bytes: Callable[[int], float],
    zero_stage: int,
    bucket_bytes: float,
    expert_bytes: Callable[[int], float] = lambda stage: 0.0,
    zero3_units: tuple[Callable[[int, int], float], UnitStarts, int] | None = None,
    overlap: tuple[Callable[[int], list[float]], UnitStarts] | None = None,
    overlap_param_gather: bool = False,
    grad_scale: float = 1.0,
) -> Program:
    """The program with each stage's gradient (and, for ZeRO, parameter) collectives added.

    `weight_bytes(stage)`: bytes of the stage's 16-bit weights on one rank (= its gradients').
    `expert_bytes(stage)`: the part of them that is routed experts; with expert parallelism
    (layout.ep > 1) those are reduced among the ranks holding the same experts (tags egrads@...,
    eparams@...), the rest over the whole data-parallel group. With dp = 1 there is nothing to
    reduce and the program is returned as it is. `zero3_units` (stage 3): (bytes of a stage's
    unit, the piece each unit of an op starts in, units prefetched) for schedules.zero3.add_zero3;
    None: each stage one unit, whole ops, one prefetched. `overlap` (stages 0-2, Megatron-LM's
    overlap_grad_reduce): (each stage's unit bytes, the piece each unit starts in) of ops cut at
    every layer; the gradients are bucketed by whole units (zero3.unit_buckets) and each bucket's
    collective starts when its units' part of the last backward has ended, overlapping the rest.
    `overlap_param_gather` (stages 1-2 with `overlap`, Megatron-LM's overlap_param_gather): each
    bucket's weights are gathered one bucket ahead of the next step's forward, the first after its
    stage's optimizer step (schedules.param_gather), not all after the steps. `grad_scale`: a
    gradient's bytes per weight byte, what the reductions move (2: FP32 gradients of 16-bit
    weights); the weight all-gathers and the buckets' bounds stay the weights'.
    """
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero stage must be one of {ZERO_STAGES}, got {zero_stage}")
    if layout.dp == 1:
        return program
    if zero_stage == 3 and layout.ep > 1:
        raise ValueError("ZeRO 3 with expert parallelism is not modelled")
    if zero_stage == 3:
        unit_bytes, unit_starts, prefetch = zero3_units or (lambda stage, unit: weight_bytes(stage), _one_unit, 1)
        return _tensor_sums_last(add_zero3(program, layout, unit_bytes, unit_starts, prefetch, grad_scale))
    if overlap is not None and layout.ep > 1:
        raise ValueError("overlapping the gradient reduction with expert parallelism is not modelled")
    if overlap_param_gather and (overlap is None or zero_stage not in (1, 2)):
        raise ValueError("overlapping the parameter all-gather needs ZeRO 1 or 2 and an overlapped reduction")
    ops: dict[int, list[Op]] = {}
    summing: set[int] = set()  # the ranks with a tensor-parallel gradient sum to move after the reductions
    # one tag object per collective, shared by its members (fewer objects on big programs)
    param_bucket = functools.cache(ParamBucket.of)
    unit_sizes, unit_starts = overlap or (lambda stage: [weight_bytes(stage)], _one_unit)
    groups = functools.cache(lambda stage: unit_buckets(unit_sizes(stage), bucket_bytes))

    @functools.cache
    def stage_buckets(stage: int, t: int, expert_rank: int | None, total: float) -> list[tuple[GradBucket, float]]:
        """A gradient set's buckets: by size, or overlapped, by whole units (expert_rank None)."""
        if overlap is None:
            return _buckets(stage, t, expert_rank, total, bucket_bytes)
        sizes = unit_sizes(stage)
        return [(GradBucket(stage, t, b), sum(sizes[u] for u in units)) for b, units in enumerate(groups(stage))]

    for rank in program.ranks:
        d, p, t = layout.coords(rank)
        sets = functools.partial(_gradient_sets, layout, d, p, t, weight_bytes, expert_bytes)
        computes = [op for op in program.ops[rank] if isinstance(op, Compute)]
        last_backward = {op.stage: op.label for op in computes if op.phase in GRADIENT_PHASES}
        # not overlapped, a stage's gradients are reduced once its last backward (or W) and whatever
        # else its optimizer step waits for but the tensor-parallel sum (blocking sends) have
        # finished, as Megatron-LM's train_step reduces them after its schedule returns; overlapped,
        # a bucket's as soon as its units' part of the last backward has (zero3.final_units)
        tensor_sums = {
            op.label for op in program.ops[rank] if isinstance(op, Collective) and isinstance(op.tag, GradSync)
        }
        if tensor_sums:
            summing.add(rank)
        grads_ready = {
            op.stage: (last_backward[op.stage], *(dep for dep in op.deps if dep not in tensor_sums))
            for op in computes
            if op.phase == Phase.OPT
        }
        if overlap is not None:
            ready = {
                label: [b for stage, unit in done for b, units in enumerate(groups(stage)) if units[0] == unit]
                for label, done in final_units(program.ops[rank], unit_uses(program.ops[rank], unit_starts)).items()
            }
        gathers, first_use, first_step = (
            _param_gathers(program.ops[rank], layout, p, t, unit_starts, groups, stage_buckets, param_bucket)
            if overlap_param_gather
            else ([], {}, "")
        )
        out: list[Op] = []
        for op in program.ops[rank]:
            if op.label in first_use:  # a bucket's first forward piece: the next bucket's gather starts
                j = first_use[op.label]
                out.extend(gathers[j + 1 : j + 2])
                if j > 0:  # and it waits for its own (the first bucket's ran after the last step's update)
                    op = dataclasses.replace(op, deps=(*op.deps, gathers[j].label))
            if isinstance(op, Compute) and op.phase == Phase.OPT:
                kind = Comm.ALL_REDUCE if zero_stage == 0 else Comm.REDUCE_SCATTER
                shard = (
                    sum(size / len(members) for _, members, size in sets(op.stage)) / weight_bytes(op.stage)
                    if zero_stage >= 1 and weight_bytes(op.stage) > 0
                    else 1.0
                )
                op = dataclasses.replace(
                    op,
                    nbytes=op.nbytes * shard,
                    flops=op.flops * shard,
                    deps=op.deps
                    + tuple(
                        f"{kind} {tag}"
                        for expert_rank, _, size in sets(op.stage)
                        for tag, _ in stage_buckets(op.stage, t, expert_rank, size)
                    ),
                )
            out.append(op)
            reduce = "all_reduce" if zero_stage == 0 else "reduce_scatter"
            if overlap is not None and isinstance(op, Compute) and op.label in ready:
                members = layout.dp_group(p, t)
                out.extend(
                    Collective(reduce, tag, members, size * grad_scale, stream=DP_STREAM, deps=(op.label,))
                    for b in ready[op.label]
                    for tag, size in [stage_buckets(op.stage, t, None, 0.0)[b]]
                )
            elif overlap is None and isinstance(op, Compute) and last_backward.get(op.stage) == op.label:
                out.extend(
                    Collective(reduce, tag, members, size * grad_scale, stream=DP_STREAM, deps=grads_ready[op.stage])
                    for expert_rank, members, total in sets(op.stage)
                    for tag, size in stage_buckets(op.stage, t, expert_rank, total)
                )
            if isinstance(op, Compute) and op.phase == Phase.OPT and zero_stage in (1, 2) and not overlap_param_gather:
                out.extend(
                    Collective("all_gather", param_bucket(tag), members, size, stream=DP_STREAM, deps=(op.label,))
                    for expert_rank, members, total in sets(op.stage)
                    for tag, size in stage_buckets(op.stage, t, expert_rank, total)
                )
            if op.label == first_step:  # the next step's first bucket, once its stage's update has run
                out.append(gathers[0])
        ops[rank] = out
    return _tensor_sums_last(dataclasses.replace(program, ops=ops), summing)


def _tensor_sums_last(program: Program, ranks: set[int] | None = None) -> Program:
    """Each stage's tensor-parallel gradient sum (GradSync) after the data-parallel reductions of
    its gradients, with the others just before the optimizer steps, as Megatron-LM runs them
    (megatron/core/distributed/finalize_model_grads.py: finish_grad_sync, then
    _allreduce_layernorm_grads; the 2022 training.py in the same order). `ranks`: those that have
    such a sum (None: look at every rank's ops)."""
    ops: dict[int, list[Op]] = {}
    for rank, rank_ops in program.ops.items():
        if ranks is not None and rank not in ranks:
            ops[rank] = rank_ops
            continue
        reduced: dict[int, list[str]] = {}
        sums: list[tuple[Collective, int]] = []
        rest: list[Op] = []
        for op in rank_ops:
            if isinstance(op, Collective) and isinstance(op.tag, GradSync):
                sums.append((op, op.tag.stage))
                continue
            if isinstance(op, Collective) and isinstance(op.tag, GradBucket):
                reduced.setdefault(op.tag.stage, []).append(op.label)
            rest.append(op)
        steps = next(i for i, op in enumerate(rest) if isinstance(op, Compute) and op.phase == Phase.OPT)
        after = [dataclasses.replace(op, deps=(*op.deps, *reduced.get(stage, ()))) for op, stage in sums]
        ops[rank] = rest[:steps] + after + rest[steps:] if sums else rank_ops
    return dataclasses.replace(program, ops=ops)


def _param_gathers(
    rank_ops: list[Op],
    layout: Layout,
    p: int,
    t: int,
    unit_starts: UnitStarts,
    groups: Callable[[int], list[range]],
    stage_buckets: Callable[[int, int, int | None, float], list[tuple[GradBucket, float]]],
    param_bucket: Callable[[GradBucket], ParamBucket],
) -> tuple[list[Collective], dict[str, int], str]:
    """The weight all-gathers of the buckets a rank's forwards use, in that order; the piece where
    each is first used -> its index; the optimizer step gather 0 follows (schedules.param_gather)."""
    uses = first_forward_uses(rank_ops, unit_starts, groups)
    steps = {op.stage: op.label for op in rank_ops if isinstance(op, Compute) and op.phase == Phase.OPT}
    first_step = steps[uses[0].stage] if uses else ""
    gathers = [
        Collective(
            "all_gather",
            param_bucket(tag),
            layout.dp_group(p, t),
            size,
            stream=DP_STREAM,
            deps=uses[j - 1].before if j > 0 else (first_step,),
        )
        for j, use in enumerate(uses)
        for tag, size in [stage_buckets(use.stage, t, None, 0.0)[use.bucket]]
    ]
    return gathers, {use.first: j for j, use in enumerate(uses)}, first_step


def _gradient_sets(
    layout: Layout,
    d: int,
    p: int,
    t: int,
    weight_bytes: Callable[[int], float],
    expert_bytes: Callable[[int], float],
    stage: int,
) -> list[tuple[int | None, tuple[int, ...], float]]:
    """[(expert rank, group, bytes)] of a stage: the dense gradients (expert rank None) over the
    data-parallel group and, with expert parallelism, the experts' over the ranks holding the same
    experts (if several)."""
    experts = expert_bytes(stage) if layout.ep > 1 else 0.0
    sets: list[tuple[int | None, tuple[int, ...], float]] = [
        (None, layout.dp_group(p, t), weight_bytes(stage) - experts)
    ]
    holders = layout.expert_dp_group(d, p, t)
    if experts > 0 and len(holders) > 1:
        sets.append((d % layout.ep, holders, experts))
    return sets


def _buckets(
    stage: int, t: int, expert_rank: int | None, total: float, bucket_bytes: float
) -> list[tuple[GradBucket, float]]:
    return [(GradBucket(stage, t, b, expert_rank), size) for b, size in enumerate(bucket_sizes(total, bucket_bytes))]


def _one_unit(phase: Phase, stage: int, split: bool) -> tuple[int, ...]:
    """Whole ops: the stage is one unit, starting in the op's first piece."""
    return (0,)
