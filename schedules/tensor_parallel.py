"""Tensor (and sequence) parallelism as a pass over a pipeline Program: each forward and backward
cut into pieces at the tensor-parallel group's collectives, which run on each rank's "tp" stream.

Megatron (Shoeybi et al. 2019) splits a layer's attention and MLP column- then row-wise over the
t ranks of a tensor-parallel group: the forward ends its attention and its MLP with an all-reduce
of the (s, b, h) activation (operator g), the backward does the same for the input gradients
(operator f): 2 all-reduces per layer each way, plus the vocab-parallel embedding's sum and the
vocab-parallel cross-entropy's gather. Sequence parallelism (Korthikanti et al. 2022) turns each
all-reduce into a reduce-scatter after and an all-gather before the sequence-split regions: the
same bytes on the wire, activations split t ways in between, and the gradients of the replicated
parameters (layernorms, row-parallel biases) summed over the group once per step.

The collectives block the compute stream (Megatron's do), so a stage op becomes piece,
collective, piece, ..., piece; each piece holds the work items between two collectives
(`tp_stage_plan`) and their FLOPs, so the time of every collective sits where it really is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from schedules.ir import Collective, Compute, Op, Program
from schedules.layout import Layout

TP_STREAM = "tp"
Piece = tuple[tuple[str, ...], str | None]  # (work items, the collective that ends the piece or None)


def tp_stage_plan(phase: str, num_layers: int, first: bool, last: bool, sequence_parallel: bool,
                  recompute_full: bool = False) -> list[Piece]:
    """The pieces of one stage op of a tensor-parallel rank, in order.

    Work items: "F.embed", "F.attn", "F.mlp", "F.head" (forward of the vocab-parallel embedding, a
    layer's attention or MLP, the LM head with its share of the cross-entropy) and the same with
    "B." for their backward; layernorms, residuals and the loss are too small to count and belong to
    no item. Forward, no sequence parallelism: [embed -> all-reduce] + per layer [attention ->
    all-reduce, MLP -> all-reduce] + [head -> all-gather of each rank's (log-sum-exp, target logit)]
    + the rest. Backward: [head -> all-reduce of its input gradient] + per layer [MLP -> all-reduce,
    attention -> all-reduce] + [embedding]. Sequence parallelism: forward [embed -> reduce-scatter]
    + per layer [all-gather, attention -> reduce-scatter, all-gather, MLP -> reduce-scatter] +
    [all-gather, head -> all-gather]; backward [head -> reduce-scatter] + per layer [all-gather,
    MLP -> reduce-scatter, all-gather, attention -> reduce-scatter] + [all-gather, embedding].
    Full recompute runs the forward's pieces again first (its last piece merging into the
    backward's first).
    """
    sp = sequence_parallel
    pieces: list[Piece] = []
    if phase == "F":
        if first:
            pieces.append((("F.embed",), "reduce_scatter" if sp else "all_reduce"))
        for _ in range(num_layers):
            for item in ("F.attn", "F.mlp"):
                pieces += [((), "all_gather"), ((item,), "reduce_scatter")] if sp else [((item,), "all_reduce")]
        if last:
            pieces += ([((), "all_gather")] if sp else []) + [(("F.head",), "all_gather")]
        return pieces + [((), None)]
    if phase != "B":
        raise ValueError(f"tensor-parallel pieces belong to F or B ops, not {phase!r}")
    if recompute_full:
        pieces = tp_stage_plan("F", num_layers, first, last, sp)[:-1]
    if last:
        pieces.append((("B.head",), "reduce_scatter" if sp else "all_reduce"))
    for _ in range(num_layers):
        for item in ("B.mlp", "B.attn"):
            pieces += [((), "all_gather"), ((item,), "reduce_scatter")] if sp else [((item,), "all_reduce")]
    if first and sp:
        pieces.append(((), "all_gather"))
    return pieces + [(("B.embed",) if first else (), None)]


def tp_collective_kinds(phase: str, num_layers: int, first: bool, last: bool, sequence_parallel: bool,
                        recompute_full: bool = False) -> list[str]:
    """The collectives inside one stage op, in order: what the shadow model's tensor-parallel
    stage (sim.numerics.tensor_parallel) yields, and what `add_tensor_parallel` schedules."""
    return [kind for _, kind in tp_stage_plan(phase, num_layers, first, last, sequence_parallel, recompute_full)
            if kind is not None]


def add_tensor_parallel(program: Program, layout: Layout, layers_per_stage: int, activation_bytes: float,
                        sequence_parallel: bool, recompute_full: bool, item_flops: Callable[[str, int], float],
                        loss_gather_bytes: float, grad_sync_bytes: Callable[[int], float]) -> Program:
    """The program with each forward and backward cut into pieces at its tensor-parallel collectives.

    `activation_bytes`: one (s, b, h) activation in bytes, what each activation collective moves
    (nccl-tests' size: the whole buffer). `item_flops(item, stage)`: FLOPs of a work item of
    `tp_stage_plan` on one rank. `loss_gather_bytes`: the cross-entropy's gather of every rank's
    per-token statistics. `grad_sync_bytes(stage)`: the replicated parameters' gradients summed
    over the group before the optimizer step (sequence parallelism only). Ops that used a whole
    op's result (its send, the next stage on the same rank, data-parallel reductions) wait for its
    last piece. With tp = 1 there is nothing to add and the program is returned as it is.
    """
    if layout.tp == 1:
        return program
    ops: dict[int, list[Op]] = {}
    for rank in program.ranks:
        d, p, _ = layout.coords(rank)
        group = layout.tp_group(d, p)
        renamed: dict[str, str] = {}  # whole op's label -> its last piece's label
        last_backward = {op.stage: op.label for op in program.ops[rank] if isinstance(op, Compute) and op.phase == "B"}
        synced: dict[int, str] = {}  # stage -> its gradient sum's label
        out: list[Op] = []
        for op in program.ops[rank]:
            deps = tuple(renamed.get(dep, dep) for dep in op.deps)
            if not (isinstance(op, Compute) and op.phase in ("F", "B")):
                if isinstance(op, Compute) and op.phase == "OPT" and op.stage in synced:
                    deps += (synced[op.stage],)
                out.append(dataclasses.replace(op, deps=deps) if deps != op.deps else op)
                continue
            plan = tp_stage_plan(op.phase, layers_per_stage, op.stage == 0, op.stage == program.num_stages - 1,
                                 sequence_parallel, recompute_full)
            for part, (items, kind) in enumerate(plan):
                piece = Compute(op.phase, op.microbatch, op.stage, sum(item_flops(i, op.stage) for i in items),
                                op.nbytes if part == 0 else 0.0, op.stream, deps, part)
                out.append(piece)
                if kind is not None:
                    size = loss_gather_bytes if "F.head" in items else activation_bytes
                    collective = Collective(kind, f"tp@d{d}.{piece.label}", group, size, stream=TP_STREAM,
                                            deps=(piece.label,))
                    out.append(collective)
                    deps = (collective.label,)
            renamed[op.label] = piece.label
            if sequence_parallel and last_backward[op.stage] == op.label:  # right away: the stream is in order
                sync = Collective("all_reduce", f"tp@d{d}.grads@{op.stage}", group, grad_sync_bytes(op.stage),
                                  stream=TP_STREAM, deps=(piece.label,))
                out.append(sync)
                synced[op.stage] = sync.label
        ops[rank] = out
    return Program(ops, program.num_stages, program.num_microbatches, program.stage_to_rank, program.replicas)
