"""Data parallelism and ZeRO as a pass over a pipeline Program: the gradient and parameter
collectives of each stage, on each rank's "dp" stream so they overlap compute.

Gradients of a stage are reduced in buckets of at most `bucket_bytes`, each bucket's collective
starting as soon as the stage's last backward has produced its gradients. With N = dp ranks in
a data-parallel group and Psi the bytes of a stage's 16-bit gradients (= its 16-bit weights):

    zero 0   all_reduce(grads) per bucket; optimizer step on everything     sends 2(N-1)/N Psi
    zero 1   reduce_scatter(grads) per bucket; optimizer step on 1/N of the  sends 2(N-1)/N Psi
             state; all_gather(weights) per bucket after the step
    zero 2   as zero 1 (gradients are also kept sharded: a memory change only)
    zero 3   weights sharded too: all_gather(weights) before every forward   sends 3(N-1)/N Psi
             and backward, reduce_scatter(grads); no gather after the step      (one microbatch)

(Rajbhandari et al. 2020, ZeRO, section 7: stages 1 and 2 move what all-reduce moves, stage 3
1.5x.) The zero 3 gathers are issued in compute order on the dp stream and each may start once
the compute op two before its own has finished: one gather ahead (prefetch, as FSDP's
forward/backward prefetch), so at most two gathered copies of a stage's weights exist at once.
With m microbatches it gathers 2m times. An op cut into pieces (tensor parallelism) gathers once,
before its first piece.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

from clustersim.schedules.ir import GRADIENT_PHASES, PIPELINE_PHASES, Collective, Comm, Compute, Op, Phase, Program
from clustersim.schedules.layout import Layout
from clustersim.schedules.tags import GradBucket, ParamBucket, ParamGather

ZERO_STAGES = (0, 1, 2, 3)
DP_STREAM = "dp"


def bucket_sizes(total_bytes: float, bucket_bytes: float) -> list[float]:
    """Split `total_bytes` into ceil(total / bucket) buckets, all full but the last."""
    count = max(1, math.ceil(total_bytes / bucket_bytes))
    return [min(bucket_bytes, total_bytes - i * bucket_bytes) for i in range(count)]


def add_data_parallel(
    program: Program,
    layout: Layout,
    weight_bytes: Callable[[int], float],
    zero_stage: int,
    bucket_bytes: float,
    expert_bytes: Callable[[int], float] = lambda stage: 0.0,
) -> Program:
    """The program with each stage's gradient (and, for ZeRO, parameter) collectives added.

    `weight_bytes(stage)`: bytes of the stage's 16-bit weights on one rank (= its gradients').
    `expert_bytes(stage)`: the part of them that is routed experts; with expert parallelism
    (layout.ep > 1) those are reduced among the ranks holding the same experts (tags egrads@...,
    eparams@...), the rest over the whole data-parallel group. With dp = 1 there is nothing to
    reduce and the program is returned as it is.
    """
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero stage must be one of {ZERO_STAGES}, got {zero_stage}")
    if layout.dp == 1:
        return program
    if zero_stage == 3 and layout.ep > 1:
        raise ValueError("ZeRO 3 with expert parallelism is not modelled")
    ops: dict[int, list[Op]] = {}
    # one tag object per collective, shared by its members (fewer objects on big programs)
    buckets, param_bucket, param_gather = (
        functools.cache(_buckets),
        functools.cache(ParamBucket.of),
        functools.cache(ParamGather),
    )
    for rank in program.ranks:
        d, p, t = layout.coords(rank)
        group = layout.dp_group(p, t)
        sets = functools.partial(_gradient_sets, layout, d, p, t, weight_bytes, expert_bytes)
        computes = [op for op in program.ops[rank] if isinstance(op, Compute)]
        last_backward = {op.stage: op.label for op in computes if op.phase in GRADIENT_PHASES}
        # a stage's gradients are whole once its last backward (or W) and whatever else its optimizer
        # step waits for (tensor parallelism's gradient sum) have finished
        grads_ready = {op.stage: (last_backward[op.stage], *op.deps) for op in computes if op.phase == Phase.OPT}
        ends = {(op.phase, op.microbatch, op.stage): op.label for op in computes}  # an op's last piece
        out: list[Op] = []
        computed: list[str] = []  # ends of the F/B ops so far, for the prefetch distance
        for op in program.ops[rank]:
            if isinstance(op, Compute) and op.phase in PIPELINE_PHASES and not op.part and zero_stage == 3:
                gather = Collective(
                    "all_gather",
                    param_gather(op.stage, t, op.label),
                    group,
                    weight_bytes(op.stage),
                    stream=DP_STREAM,
                    deps=(computed[-2],) if len(computed) >= 2 else (),
                )
                out.append(gather)
                computed.append(ends[(op.phase, op.microbatch, op.stage)])
                op = dataclasses.replace(op, deps=op.deps + (gather.label,))
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
                        for tag, _ in buckets(op.stage, t, expert_rank, size, bucket_bytes)
                    ),
                )
            out.append(op)
            if isinstance(op, Compute) and op.phase in GRADIENT_PHASES and last_backward[op.stage] == op.label:
                reduce = "all_reduce" if zero_stage == 0 else "reduce_scatter"
                out.extend(
                    Collective(reduce, tag, members, size, stream=DP_STREAM, deps=grads_ready[op.stage])
                    for expert_rank, members, total in sets(op.stage)
                    for tag, size in buckets(op.stage, t, expert_rank, total, bucket_bytes)
                )
            if isinstance(op, Compute) and op.phase == Phase.OPT and zero_stage in (1, 2):
                out.extend(
                    Collective("all_gather", param_bucket(tag), members, size, stream=DP_STREAM, deps=(op.label,))
                    for expert_rank, members, total in sets(op.stage)
                    for tag, size in buckets(op.stage, t, expert_rank, total, bucket_bytes)
                )
        ops[rank] = out
    return dataclasses.replace(program, ops=ops)


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
