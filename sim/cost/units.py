"""Units of layers in numbers: ZeRO 3's (FSDP's wrapping units) and the layers an overlapped
gradient reduction buckets; which layers each unit of a stage holds, its weight bytes on one rank,
and the closed form of ZeRO 3's gathered weights' peak (schedules.zero3).

A stage of L layers in units of u layers has ceil(L / u) units, unit k the layers [k u, (k+1) u)
of the stage (the last one shorter when u does not divide L); the embeddings belong to the first
unit of stage 0, the final layernorm and LM head to the last unit of the last stage, as FSDP's
root unit keeps them beside the first and last layers.
"""

from __future__ import annotations

from collections.abc import Callable

from clustersim.schedules.ir import Phase
from clustersim.schedules.tensor_parallel import TensorParallelPlan
from clustersim.schedules.zero3 import unit_buckets, unit_ranges
from clustersim.sim.collectives import moe_dispatch
from clustersim.sim.cost.stages import layers_params, stage_layer_range, stage_moe_layers
from clustersim.sim.scenario.schema import Scenario
from clustersim.sim.scenario.sections import ParallelSection


def stage_units(scenario: Scenario, stage: int, unit_layers: int | None = None) -> list[range]:
    """The layers of each unit of a stage, `unit_layers` per unit (default parallel.zero3_unit_layers)."""
    return unit_ranges(stage_layer_range(scenario, stage), unit_layers or scenario.parallel.zero3_unit_layers)


def unit_weight_bytes(scenario: Scenario, stage: int, unit: int, unit_layers: int | None = None) -> float:
    """Bytes of a unit's 16-bit weights on one rank (= its gradients'): what its all-gather
    brings and its reduce-scatter reduces (`unit_layers`: as in `stage_units`)."""
    units = stage_units(scenario, stage, unit_layers)
    last = scenario.parallel.num_stages - 1
    embed, head = stage == 0 and unit == 0, stage == last and unit == len(units) - 1
    return layers_params(scenario, units[unit], embed, head) * 2.0


def peak_gathered_bytes(unit_bytes: list[float], prefetch: int) -> float:
    """The most gathered weights a rank holds at once when it uses units of `unit_bytes` (in
    compute order) with `prefetch` units gathered ahead: the largest sum of prefetch + 1
    consecutive uses (schedules.zero3; fewer uses than that: all of them)."""
    window = min(prefetch + 1, len(unit_bytes))
    return max(sum(unit_bytes[i : i + window]) for i in range(len(unit_bytes) - window + 1))


def cut_unit_layers(p: ParallelSection) -> int | None:
    """Layers per unit the stage ops are cut at: ZeRO 3's units (dp > 1), or one layer when the
    gradient reduction overlaps the backward (ZeRO 0-2, dp > 1); None: no unit cuts."""
    if p.dp == 1:
        return None
    return p.zero3_unit_layers if p.zero == 3 else 1 if p.megatron.overlap_grad_reduce else None


def tensor_parallel_plan(scenario: Scenario) -> TensorParallelPlan:
    """How the program cuts each stage op into pieces (schedules.tensor_parallel), which the kernel
    model's times follow piece by piece: at the tensor-parallel collectives, the MoE layers'
    all-to-alls, the units above, and the overlapped GEMMs' edges."""
    p = scenario.parallel
    moe_layers = [stage_moe_layers(scenario, stage) for stage in range(p.num_stages)]
    return TensorParallelPlan(
        moe_layers.__getitem__,
        p.sequence_parallel,
        scenario.training.recompute == "full",
        cut_unit_layers(p),
        p.scatter_gather_messages,
        p.megatron.tp_comm_overlap,
        ep_algorithm(scenario),
    )


def ep_algorithm(scenario: Scenario) -> str:
    """The expert-parallel exchanges' all_to_all algorithm: NCCL's (auto), or with the flex
    dispatcher sim.collectives.moe_dispatch's for the model's routing."""
    moe = scenario.model_spec.moe
    if scenario.parallel.megatron.moe_dispatcher == "flex" and moe is not None:
        groups = moe.expert_groups
        return moe_dispatch.Routing(moe.top_k, moe.num_experts, groups, moe.limited_groups or groups).name
    return "auto"


def layer_bytes(scenario: Scenario, stage: int) -> list[float]:
    """The 16-bit weight bytes of each layer of a stage (the embedding with the first, the head
    with the last), what an overlapped gradient reduction buckets."""
    return [unit_weight_bytes(scenario, stage, u, 1) for u in range(len(stage_units(scenario, stage, 1)))]


def unit_bucket_groups(scenario: Scenario) -> Callable[[int], list[range]] | None:
    """Stage -> the units in each gradient bucket, when buckets are whole units: ZeRO 3's (one
    unit each) or an overlapped reduction's (schedules.zero3.unit_buckets); None: by size."""
    p = scenario.parallel
    if cut_unit_layers(p) is None:
        return None
    if p.zero == 3:
        return lambda stage: [range(u, u + 1) for u in range(len(stage_units(scenario, stage)))]
    return lambda stage: unit_buckets(layer_bytes(scenario, stage), p.bucket_bytes)


def gathered_peak_bytes(scenario: Scenario, steps: list[tuple[Phase, int, int]]) -> float:
    """ZeRO 3: the most gathered weights a rank holds, from its compute order `steps` ((phase,
    microbatch, stage), schedules.pipeline.rank_order): a forward uses its stage's units first to
    last, a backward last to first (schedules.zero3)."""
    uses: list[float] = []
    sizes: dict[int, list[float]] = {}  # each stage's units, worked out once
    for phase, _, stage in steps:
        if phase in (Phase.F, Phase.B):
            if stage not in sizes:
                sizes[stage] = [unit_weight_bytes(scenario, stage, u) for u in range(len(stage_units(scenario, stage)))]
            uses += sizes[stage] if phase == Phase.F else sizes[stage][::-1]
    return peak_gathered_bytes(uses, scenario.parallel.zero3_prefetch)
