"""The build phase of a run: a scenario's network graph (its topology kind's builder), its
program (validated op lists, of the representatives only when the run is symmetric), the shadow
model's numerics and the compute cost of an op. Pure functions of the scenario."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from operator import attrgetter

import networkx as nx

from clustersim.schedules.data_parallel import add_data_parallel, bucket_sizes
from clustersim.schedules.ir import Compute, Phase, Program
from clustersim.schedules.layout import Layout
from clustersim.schedules.order import split_steps
from clustersim.schedules.param_gather import first_forward_stages
from clustersim.schedules.pipeline import build_program, placement, rank_order
from clustersim.schedules.stage_pieces import unit_starts
from clustersim.schedules.tensor_parallel import PieceCosts, TensorParallelPlan, add_tensor_parallel
from clustersim.schedules.validate import validate
from clustersim.schedules.zero3 import UnitStarts
from clustersim.sim.collectives.nccl import NCCL
from clustersim.sim.collector import collector_paused
from clustersim.sim.cost import compute as cost
from clustersim.sim.cost.kernel_times import KernelTimes, piece_item_flops
from clustersim.sim.cost.stages import (
    alltoall_bytes,
    expert_bytes,
    partial_grad_params,
    stage_forward_flops,
    stage_layer_range,
    stage_params,
    stage_weight_gradient_flops,
    weight_bytes,
)
from clustersim.sim.cost.units import (
    cut_unit_layers,
    layer_bytes,
    tensor_parallel_plan,
    unit_bucket_groups,
    unit_weight_bytes,
)
from clustersim.sim.numerics.data_parallel import DataParallelNumerics
from clustersim.sim.numerics.moe import MoEConfig
from clustersim.sim.numerics.pipeline import PipelineNumerics
from clustersim.sim.numerics.plan import Sharding, TrainingStep
from clustersim.sim.numerics.transformer import ShadowConfig
from clustersim.sim.scale.execution import members_held
from clustersim.sim.scale.symmetry import Symmetry, listable
from clustersim.sim.scenario.schema import Scenario
from clustersim.sim.scenario.sections import ParallelSection
from clustersim.topologies.kind import SHARDS_ONLY, ReplicaBlocks, Shape
from clustersim.topologies.registry import TOPOLOGIES


def build_topology(scenario: Scenario) -> nx.DiGraph:
    """The scenario's network graph, built by its kind (topologies.registry) from its keys, with
    the NCCL layer's settings on it when cluster.nccl is given."""
    c = scenario.cluster
    graph = TOPOLOGIES[c.topology.kind].build(c.topology, Shape(c.nodes, c.gpus_per_node))
    if c.nccl_config is not None:  # collectives run as NCCL does (sim.collectives.nccl)
        graph.graph[NCCL] = c.nccl_config
    return graph


def layout_of(scenario: Scenario) -> Layout:
    p = scenario.parallel
    return Layout(p.dp, p.pp, p.tp, tuple(p.order), p.ep)


def pipelines_of(layout: Layout) -> list[tuple[int, ...]]:
    """The ranks of every pipeline, one per (data-parallel replica, tensor-parallel shard)."""
    return [layout.pp_group(d, t) for d in range(layout.dp) for t in range(layout.tp)]


def replica_placements(scenario: Scenario) -> list[dict[int, int]]:
    """Stage -> rank for each pipeline: the schedule's placement (stage c x pp + r on the
    pipeline's r-th rank for chunk c of v = parallel.virtual; a V for zbv and dualpipev)."""
    p = scenario.parallel
    local = placement(scenario.schedule, p.pp, p.virtual)
    return [{stage: ranks[r] for stage, r in local.items()} for ranks in pipelines_of(layout_of(scenario))]


def make_program(
    scenario: Scenario, representatives: Collection[int] | None = None, check: bool = True, dry_run: bool = True
) -> Program:
    """The validated per-rank op lists: one pipeline per (data-parallel replica, tensor-parallel
    shard), then the tensor-parallel and the data-parallel / ZeRO collectives. `representatives`:
    build only the pipelines of these ranks (a program of representatives, sim.symmetry). `check`
    False skips the validation (sim.preflight only counts the ops of programs it never runs);
    `dry_run` False its deadlock dry run (for a program the engine walks: schedules.validate)."""
    p, m, t = scenario.parallel, scenario.model_spec, scenario.training
    flops = [stage_forward_flops(scenario, stage) for stage in range(p.num_stages)]
    layer_act = cost.boundary_activation_bytes(t.micro_batch, m.seq_len, m.hidden, scenario.dtype_bytes)
    split = p.sequence_parallel or p.scatter_gather_messages  # each rank sends its 1/tp: its sequence shard, or a chunk
    act_bytes = layer_act / p.tp if split else layer_act
    order = rank_order(scenario.schedule, p.pp, scenario.num_microbatches, p.virtual)
    redo = [
        sum(
            cost.model_layer_recompute_flops(m, t.micro_batch, i, t.recompute)
            for i in stage_layer_range(scenario, stage)
        )
        / p.tp
        for stage in range(p.num_stages)
    ]
    pipeline = build_program(
        order,
        scenario.num_microbatches,
        placement(scenario.schedule, p.pp, p.virtual),
        act_bytes,
        forward_flops=lambda s: flops[s],
        backward_flops=lambda s: 2 * flops[s] + redo[s],
        optimizer_bytes=lambda s: stage_params(scenario, s) * cost.ADAM_BYTES_PER_PARAM,
        weight_flops=lambda s: stage_weight_gradient_flops(scenario, s),
        blocking_p2p=scenario.blocking_p2p,
    )
    layout = layout_of(scenario)
    replicas = [
        pipeline.relabel(dict(enumerate(ranks)))
        for ranks in pipelines_of(layout)
        if representatives is None or ranks[0] in representatives
    ]
    plan = tensor_parallel_plan(scenario)
    item_flops, item_weight_flops = piece_item_flops(scenario)
    program = add_tensor_parallel(
        Program.merge(replicas),
        layout,
        plan,
        PieceCosts(
            item_flops,
            activation_bytes=layer_act,
            loss_gather_bytes=p.tp * 2 * t.micro_batch * m.seq_len * 4.0,
            grad_sync_bytes=lambda s: partial_grad_params(scenario, s) * scenario.gradient_bytes,
            alltoall_bytes=alltoall_bytes(scenario),
            counts_bytes=m.moe.num_experts * 8.0 if m.moe is not None else 0.0,
            item_weight_flops=item_weight_flops,
        ),
    )
    program = add_data_parallel(
        program,
        layout,
        lambda s: weight_bytes(scenario, s),
        p.zero,
        p.bucket_bytes,
        lambda s: expert_bytes(scenario, s),
        (functools.partial(unit_weight_bytes, scenario), _unit_starts(plan, layout, p.num_stages), p.zero3_prefetch),
        (lambda s: layer_bytes(scenario, s), _unit_starts(plan, layout, p.num_stages))
        if p.megatron.overlap_grad_reduce
        else None,
        p.megatron.overlap_param_gather,
        scenario.gradient_bytes / 2.0,
    )
    if check:
        validate(program, attrgetter("group") if representatives is None else members_held(program), dry_run)
    return program


def _unit_starts(plan: TensorParallelPlan, layout: Layout, num_stages: int) -> UnitStarts:
    """The piece each unit of a cut stage op starts in (stage_pieces.unit_starts of the same plan
    add_tensor_parallel cut it by)."""

    @functools.cache
    def starts(phase: Phase, stage: int, split: bool) -> tuple[int, ...]:
        return unit_starts(plan.stage_plan(phase, stage, num_stages, layout.tp, layout.ep))

    return starts


def compute_time_fn(scenario: Scenario) -> Callable[[Compute], float]:
    """cluster.compute_model: kernel, the op's kernels (sim.cost.kernel_times); roofline, as long
    as the slower of its FLOPs at the GPU's efficiency and its memory traffic."""
    if scenario.cluster.compute_model == "kernel":
        return KernelTimes(scenario).time_fn()
    gpu = scenario.gpu_spec
    return lambda op: max(
        cost.compute_time_s(op.flops, gpu.peak_flops, gpu.efficiency),
        cost.memory_time_s(op.nbytes, gpu.hbm_bandwidth_Bps),
    )


def make_numerics(scenario: Scenario) -> PipelineNumerics | DataParallelNumerics | None:
    """The shadow model: the real layer count and stage split (pp x v stages), a tiny hidden size;
    with dp > 1 one pipeline per replica on its slice of the batch, reduced through the real
    collectives; with tp > 1 one pipeline per tensor-parallel rank, holding its shards."""
    n, p = scenario.numerics, scenario.parallel
    if not n.enabled:
        return None
    m, moe = scenario.model_spec, scenario.model_spec.moe
    cfg = ShadowConfig(
        layers=m.layers,
        hidden=n.hidden,
        heads=n.heads,
        kv_heads=n.heads * m.kv_heads // m.heads if m.kv_heads else None,  # the real model's grouping
        ffn=4 * n.hidden,
        seq_len=n.seq_len,
        vocab=n.vocab,
        dtype=n.dtype,
        # the real experts, top-k, capacity and shared expert; top-k > 1 renormalised (Mixtral, GShard); one routing
        # group per (replica, microbatch, tensor-parallel rank), as the run has: each routes 1/tp of a microbatch
        moe=MoEConfig(
            moe.num_experts,
            moe.top_k,
            moe.capacity_factor,
            moe.top_k > 1,
            moe.shared_experts == 1,
            _selection_bias(moe.num_experts, n.hot_expert_bias),
            n.micro_batch * n.seq_len // p.tp,
            moe.expert_groups,
            moe.limited_groups,
        )
        if moe is not None
        else None,
        moe_layers=moe.moe_layers(m.layers) if moe is not None else (),
        stage_layers=tuple(p.stage_layers) if p.stage_layers is not None else None,
    )
    placements = replica_placements(scenario)
    order = rank_order(scenario.schedule, p.pp, scenario.num_microbatches, p.virtual)
    step = TrainingStep(
        scenario.num_microbatches,
        n.micro_batch,
        n.seed,
        n.optimizer,
        n.lr,
        recompute_full=scenario.training.recompute == "full",  # selective changes no arithmetic of the shadow
        split_backward=frozenset(split_steps(order)),
    )
    if p.dp == 1 and p.tp == 1:
        return PipelineNumerics(cfg, placements[0], step)
    experts = (lambda s: expert_bytes(scenario, s)) if p.ep > 1 else (lambda s: 0.0)  # as the program's sets
    groups = unit_bucket_groups(scenario)
    buckets = {
        (what, s): len(bucket_sizes(size, p.bucket_bytes)) if groups is None or what == "egrads" else len(groups(s))
        for s in range(p.num_stages)
        for what, size in (("grads", weight_bytes(scenario, s) - experts(s)), ("egrads", experts(s)))
    }
    return DataParallelNumerics(
        cfg,
        placements,
        step,
        p.zero if p.dp > 1 else 0,
        buckets,
        Sharding(
            p.tp,
            p.sequence_parallel,
            p.ep,
            unit_layers=cut_unit_layers(p),
            scatter_gather=p.scatter_gather_messages,
            tp_comm_overlap=p.megatron.tp_comm_overlap,
        ),
        groups,
        first_forward_stages(order) if p.megatron.overlap_param_gather and p.dp > 1 else None,
    )


def _selection_bias(num_experts: int, hot_expert_bias: float) -> tuple[float, ...] | None:
    """numerics.hot_expert_bias on expert 0's routing score (a skewed router), None when 0."""
    return (hot_expert_bias,) + (0.0,) * (num_experts - 1) if hot_expert_bias else None


def symmetry_of(scenario: Scenario) -> Symmetry | None:
    """The images under which this run looks the same from its representatives (sim.scale.symmetry),
    or None: numerics off (every replica computes on its own data), more than one image, and a
    fabric that says which shifts of blocks of ep replicas map it and its routes onto themselves,
    or that only shard shifts do (SHARDS_ONLY) and which blocks lie on it alike (TopologyKind)."""
    p, cluster = scenario.parallel, scenario.cluster
    kind = TOPOLOGIES[cluster.topology.kind]
    if scenario.numerics.enabled or p.dp // p.ep * p.tp == 1 or kind.symmetry is None:
        return None
    contiguous = _replicas_contiguous(p)
    grid = layout_of(scenario).grid  # (dp, pp, tp) -> rank, which is the GPU
    placement = () if contiguous else tuple(map(tuple, grid.reshape(p.dp // p.ep, -1).tolist()))
    blocks = ReplicaBlocks(p.ep * p.pp * p.tp, p.dp // p.ep, p.tp, contiguous, placement)
    shape = Shape(cluster.nodes, cluster.gpus_per_node)
    step = kind.symmetry(cluster.topology, shape, blocks)
    if step == SHARDS_ONLY:  # one block of each class walked, one shard of each
        found = kind.classes(cluster.topology, shape, blocks) if kind.classes is not None else None
        classes = listable(found, blocks.count, p.tp * p.world_size)
        return Symmetry(layout_of(scenario), classes=classes) if p.tp > 1 or len(classes) < blocks.count else None
    return None if step is None else Symmetry(layout_of(scenario), step * p.ep)


def _replicas_contiguous(p: ParallelSection) -> bool:
    """Whether the rank order lays the replicas out as (dp, pp, tp) does, each a block of
    consecutive ranks: an axis of size 1 does not vary, so only the others' order counts
    (Megatron's (pp, dp, tp) at pp 1 is (dp, pp, tp))."""
    varying = [axis for axis in p.order if getattr(p, axis) > 1]
    return varying == [axis for axis in ("dp", "pp", "tp") if getattr(p, axis) > 1]


def program_of(scenario: Scenario, exact: bool = False) -> Program:
    """The program `simulate` runs: the representatives' when the run is symmetric (and not
    `exact`), else every rank's. Built with the cyclic collector paused, as the engine runs: its
    ops (hundreds of thousands on a big run) live to the end (sim.collector)."""
    symmetry = None if exact else symmetry_of(scenario)
    with collector_paused():
        return make_program(scenario, symmetry.representatives if symmetry is not None else None, dry_run=False)
