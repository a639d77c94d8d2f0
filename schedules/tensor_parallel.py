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
With Transformer Engine's overlap (`tp_comm_overlap`, schedules.tp_overlap) a collective on an
overlapped group runs beside the next piece (the GEMM it overlaps) and the piece after that waits
for both.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

from clustersim.schedules.ir import (
    GRADIENT_PHASES,
    PIPELINE_PHASES,
    Collective,
    Compute,
    Op,
    Phase,
    Program,
    Recv,
    with_deps,
)
from clustersim.schedules.layout import Layout
from clustersim.schedules.stage_pieces import UNIT_ITEM, Piece, tp_stage_plan
from clustersim.schedules.tags import ChunkTail, CollectiveTag, ExpertPiece, GradSync, StageInput, TensorPiece
from clustersim.schedules.tp_overlap import BESIDE, OVERLAPPED, PIPELINED, TAIL, collective_share

TP_STREAM = "tp"
EP_STREAM = "ep"


@dataclass(frozen=True)
class TensorParallelPlan:
    """How a stage's ops are cut: which layers each stage has and how the model runs them."""

    stage_layers: Callable[[int], list[bool]]  # stage -> for each of its layers, whether its MLP is MoE
    sequence_parallel: bool
    recompute_full: bool  # the backward runs the forward's pieces again first
    unit_layers: int | None = None  # ZeRO 3: cut at every unit of this many layers (tp_stage_plan)
    # Megatron's scatter/gather of pipeline messages: each rank received 1/t of one (tp > 1)
    scatter_gather: bool = False
    tp_comm_overlap: bool = False  # Transformer Engine's userbuffers overlap (schedules.tp_overlap)
    ep_algorithm: str = "auto"  # the MoE dispatches' and combines' all_to_all algorithm (sim.collectives)

    def stage_plan(self, phase: Phase, stage: int, num_stages: int, tp: int, ep: int) -> list[Piece]:
        """tp_stage_plan's pieces of (phase, stage), in a pipeline of `num_stages` stages."""
        return tp_stage_plan(
            phase,
            self.stage_layers(stage),
            stage == 0,
            stage == num_stages - 1,
            self.sequence_parallel,
            self.recompute_full,
            tp=tp,
            ep=ep,
            unit_layers=self.unit_layers,
            overlap=self.tp_comm_overlap,
        )


@dataclass(frozen=True)
class PieceCosts:
    """What the pieces and their collectives cost, on one rank, in FLOPs and bytes (nccl-tests'
    size: the whole buffer).

    `item_flops(item, stage)`: a work item's FLOPs. `activation_bytes`: one (s, b, h) activation,
    what each activation collective moves. `loss_gather_bytes`: the cross-entropy's gather of every
    rank's per-token statistics. `grad_sync_bytes(stage)`: the gradients each rank of the group
    computed from its own share of the tokens, summed over the group once before the optimizer
    step: with sequence parallelism the replicated parameters', and in a stage with MoE layers
    (whose tokens are split t ways, whole experts on every rank) the routers', shared experts' and
    the rank's experts'. `alltoall_bytes`: one rank's send buffer of a dispatch or combine (its
    routed token rows), spread evenly over the expert-parallel group; `counts_bytes`: one rank's
    send buffer of the counts exchanged before each dispatch."""

    item_flops: Callable[[str, int], float]
    activation_bytes: float
    loss_gather_bytes: float
    grad_sync_bytes: Callable[[int], float]
    alltoall_bytes: float = 0.0
    counts_bytes: float = 0.0
    # a backward item's weight-gradient FLOPs, which a split backward's B leaves to its W
    item_weight_flops: Callable[[str, int], float] = lambda item, stage: 0.0

    def collective_bytes(self, on: str, items: tuple[str, ...]) -> float:
        """The size of the collective on group `on` that ends a piece of `items`."""
        if on == "ep":
            return self.alltoall_bytes
        if on == "ep_counts":
            return self.counts_bytes
        if "F.head" in items:
            return self.loss_gather_bytes
        return self.activation_bytes * float(collective_share(on))


PlannedPiece = tuple[tuple[str, ...], str | None, str | None, float]  # a Piece and its FLOPs


def add_tensor_parallel(program: Program, layout: Layout, plan: TensorParallelPlan, costs: PieceCosts) -> Program:
    """The program with each forward and backward cut into pieces at its tensor-parallel
    collectives and its MoE layers' expert-parallel all-to-alls (`tp_stage_plan`), and (ZeRO 3,
    `plan.unit_layers`) where its units start; an op cut at units alone keeps its FLOPs, shared
    among the pieces as their work items' FLOPs are. With `plan.scatter_gather` each pipeline
    message arrives as t chunks of 1/t (one per rank of the group, Megatron-LM's
    scatter_gather_tensors_in_pipeline) and is all-gathered over the group before use.

    Ops that used a whole op's result (its send, the next stage on the same rank, data-parallel
    reductions) wait for its last piece. With tp = 1, no expert-parallel MoE layer and no stage of
    more than one unit there is nothing to cut and the program is returned as it is.
    """
    stage_layers = plan.stage_layers
    at_collectives = {
        stage: layout.tp > 1 or (layout.ep > 1 and any(stage_layers(stage))) for stage in range(program.num_stages)
    }
    cut = {
        stage: by_collective or (plan.unit_layers is not None and len(stage_layers(stage)) > plan.unit_layers)
        for stage, by_collective in at_collectives.items()
    }
    if not any(cut.values()):
        return program
    ops: dict[int, list[Op]] = {}
    plans: dict[tuple[Phase, int, bool], list[PlannedPiece]] = {}  # (phase, stage, split) -> pieces

    def item_cost(item: str, stage: int, split: bool) -> float:
        """An item's FLOPs; in a split backward's B, less its weight gradient (the W op's)."""
        if item == UNIT_ITEM:
            return 0.0
        flops = costs.item_flops(item, stage)
        return flops - costs.item_weight_flops(item, stage) if split and item.startswith("B.") else flops

    def plan_of(phase: Phase, stage: int, split: bool = False) -> list[PlannedPiece]:
        """tp_stage_plan's pieces of (phase, stage), each with its FLOPs (the same on every rank);
        `split`: a B whose weight gradient a W op computes."""
        if (phase, stage, split) not in plans:
            plans[(phase, stage, split)] = [
                (items, kind, on, sum(item_cost(i, stage, split) for i in items))
                for items, kind, on in plan.stage_plan(phase, stage, program.num_stages, layout.tp, layout.ep)
            ]
        return plans[(phase, stage, split)]

    collective_bytes = functools.cache(costs.collective_bytes)  # asked once per piece of every op: millions
    # one tag object per collective, shared by its members (fewer objects on big programs)
    tensor_piece, expert_piece, grad_sync, stage_input, chunk_tail = (
        functools.cache(TensorPiece),
        functools.cache(ExpertPiece),
        functools.cache(GradSync),
        functools.cache(StageInput),
        functools.cache(ChunkTail),
    )
    for rank in program.ranks:
        d, p, t = layout.coords(rank)
        ep_group = layout.ep_group(d, p, t)
        groups: dict[str, tuple[tuple[int, ...], str, Callable[[str], CollectiveTag]]] = {
            "tp": (layout.tp_group(d, p), TP_STREAM, functools.partial(tensor_piece, d)),
            "ep": (ep_group, EP_STREAM, functools.partial(expert_piece, p, t, d // layout.ep)),
        }
        groups["ep_counts"] = groups["ep"]
        groups[OVERLAPPED] = groups[PIPELINED] = groups["tp"]
        groups[TAIL] = (groups["tp"][0], TP_STREAM, functools.partial(chunk_tail, d))
        renamed: dict[str, str] = {}  # whole op's label -> its last piece's label
        computes = [op for op in program.ops[rank] if isinstance(op, Compute)]
        last_backward = {op.stage: op.label for op in computes if op.phase in GRADIENT_PHASES}
        split = {(op.microbatch, op.stage) for op in computes if op.phase == Phase.W}
        synced: dict[int, str] = {}  # stage -> its gradient sum's label
        out: list[Op] = []

        def sync_after(
            op: Compute, last: str, d=d, out=out, synced=synced, last_backward=last_backward, group=groups["tp"][0]
        ) -> None:
            """After a stage's last gradient op (labelled `last`: its last piece), the gradient sum
            over the tensor-parallel group of what each rank computed from its share of the tokens."""
            partial_grads = plan.sequence_parallel or any(stage_layers(op.stage))
            if layout.tp > 1 and partial_grads and last_backward[op.stage] == op.label:  # the stream is in order
                sync = Collective(
                    "all_reduce",
                    grad_sync(d, op.stage),
                    group,
                    costs.grad_sync_bytes(op.stage),
                    stream=TP_STREAM,
                    deps=(last,),
                )
                out.append(sync)
                synced[op.stage] = sync.label

        gathered: dict[str, str] = {}  # a chunked message's RECV label -> its all-gather's
        for op in program.ops[rank]:
            deps = tuple(renamed.get(dep, dep) for dep in op.deps)
            deps += tuple(gathered[dep] for dep in op.deps if dep in gathered)
            if isinstance(op, Recv) and plan.scatter_gather and layout.tp > 1:  # gather the t chunks first
                phase, mb, stage = op.tag
                gather = Collective(
                    "all_gather",
                    stage_input(d, str(phase), mb, stage),
                    groups["tp"][0],
                    costs.activation_bytes,
                    stream=TP_STREAM,
                    deps=(op.label,),
                )
                out += [op, gather]
                gathered[op.label] = gather.label
                continue
            if not (isinstance(op, Compute) and op.phase in PIPELINE_PHASES and cut[op.stage]):
                if isinstance(op, Compute) and op.phase == Phase.OPT and op.stage in synced:
                    deps += (synced[op.stage],)
                out.append(with_deps(op, deps) if deps != op.deps else op)
                if isinstance(op, Compute) and op.phase == Phase.W and cut[op.stage]:  # a W is whole: no collective
                    sync_after(op, op.label)
                continue
            pieces = plan_of(op.phase, op.stage, (op.microbatch, op.stage) in split)
            share = op.flops / sum(p[3] for p in pieces) if not at_collectives[op.stage] else 1.0
            beside: tuple[str, ...] = ()  # an overlapped collective the next piece runs beside
            after: tuple[str, ...] = ()  # the one the previous piece ran beside, which this one waits for
            for part, (items, kind, on, flops) in enumerate(pieces):
                piece = Compute(
                    op.phase,
                    op.microbatch,
                    op.stage,
                    flops * share,
                    op.nbytes if part == 0 else 0.0,
                    op.stream,
                    deps + after,
                    part,
                )
                out.append(piece)
                after, beside = beside, ()
                if kind is not None and on is not None:
                    group, stream, tag = groups[on]
                    size = collective_bytes(on, items)
                    algorithm = plan.ep_algorithm if on == "ep" else "auto"
                    collective = Collective(kind, tag(piece.label), group, size, algorithm, stream, (piece.label,))
                    out.append(collective)
                    if on in BESIDE:  # the next piece runs beside it
                        beside = (collective.label,)
                    else:  # (a pipelined reduce-scatter's tail follows its head on the stream)
                        deps, after = (collective.label,), ()
            renamed[op.label] = piece.label
            sync_after(op, piece.label)
        ops[rank] = out
    return dataclasses.replace(program, ops=ops)
