"""The planner's analytical estimate of a candidate: its memory peak per rank (exact for the
simulator's memory model) and its step time (a quick estimate, only to rank candidates before
the top ones are simulated in full).

Memory: the same formulas as a run's memory timeline (sim.run.memory_of): ZeRO-sharded model
states of the stages a rank holds (sim.cost.memory.model_state_bytes of sim.cost.stages.stage_params),
the most activations the rank holds at once under the schedule (sim.plan.timeline.peak_held_bytes
of each stage's bytes per microbatch, sim.cost.stages.stage_activation_bytes: its layers', the
embedding's or the LM head's, its output while sent; a split backward's B frees the loss's part,
stage_input_gradient_bytes), and ZeRO-3's gathered units: the largest prefetch + 1
consecutive units in the rank's compute order (sim.cost.units.peak_gathered_bytes). Exact but
for ZeRO 3, where it is an upper bound: the gathered units' peak and the activations' are added,
though they need not come at the same moment.

Step time:

    step = pipeline(f, b) + exposed data parallel + optimizer (the larger of the end ranks')

    f = forward of one chunk (stage_forward_flops / (peak x efficiency), or its kernels' time with
        cluster.compute_model: kernel; the rank's mean over its chunks) + its layers' tensor-parallel
        collectives (2 per layer each way, 2 more when a full recompute re-runs the forward; 2
        all-to-alls per MoE layer each way) + one activation send
    b = the same for the backward: 2 x forward FLOPs + recompute FLOPs
    pipeline(f, b) = the schedule played with the slowest rank's op times (sim.plan.timeline), less
        what each other rank's chunk is short of them (the embedding's, the head's and the middle
        ranks' differ), once each: the fill and drain pass every rank once
    exposed data parallel = the gradient reduction (all-reduce, or reduce-scatter for ZeRO >= 1)
        beyond the rank's last backward, which hides it, + ZeRO 1/2's weight all-gather after the
        step + ZeRO 3's per-op gathers beyond the op they prefetch for
    optimizer = 28 bytes per (sharded) parameter over HBM bandwidth

Every collective is timed on the scenario's own fabric and groups by the simulator's network
(sim.collectives.run.time_collective), at 1 MiB and 1 GiB, and interpolated linearly in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import networkx as nx

from clustersim.schedules.ir import Phase
from clustersim.schedules.pipeline import placement, rank_order
from clustersim.sim.build import build_topology, layout_of
from clustersim.sim.collectives.run import time_collective
from clustersim.sim.cost import compute as cost
from clustersim.sim.cost.kernel_times import KernelTimes
from clustersim.sim.cost.memory import model_state_bytes
from clustersim.sim.cost.stages import (
    alltoall_bytes,
    stage_activation_bytes,
    stage_forward_flops,
    stage_input_gradient_bytes,
    stage_layer_range,
    stage_moe_layers,
    stage_params,
    weight_bytes,
)
from clustersim.sim.cost.units import ep_algorithm, gathered_peak_bytes
from clustersim.sim.plan.space import scenario_of
from clustersim.sim.plan.timeline import peak_held_bytes, play
from clustersim.sim.scenario.schema import Scenario

SMALL_BYTES, LARGE_BYTES = 2**20, 2**30  # the two sizes each collective is timed at


@dataclass(frozen=True)
class Estimate:
    """A candidate's estimated step time and its memory peak (the largest rank's, bytes)."""

    step_time_s: float
    memory_peak_bytes: float
    memory_capacity_bytes: float

    @property
    def fits(self) -> bool:
        return self.memory_peak_bytes <= self.memory_capacity_bytes


class Fabric:
    """Collective times on one cluster's graph, each (op, group) timed twice and cached."""

    def __init__(self, graph: nx.DiGraph):
        self.graph = graph
        self._time = lru_cache(maxsize=None)(self._two_sizes)

    def _two_sizes(self, op: str, group: tuple[int, ...], algorithm: str) -> tuple[float, float]:
        return (
            time_collective(self.graph, op, algorithm, group, SMALL_BYTES)[0],
            time_collective(self.graph, op, algorithm, group, LARGE_BYTES)[0],
        )

    def seconds(self, op: str, group: tuple[int, ...], nbytes: float, algorithm: str = "auto") -> float:
        """Seconds of `op` on `group` moving `nbytes` (nccl-tests' size) by `algorithm`; 0 on one
        GPU or no bytes."""
        if len(group) < 2 or nbytes <= 0:
            return 0.0
        small_s, large_s = self._time(op, group, algorithm)
        return max(0.0, small_s + (nbytes - SMALL_BYTES) * (large_s - small_s) / (LARGE_BYTES - SMALL_BYTES))


def memory_peak_bytes(scenario: Scenario) -> float:
    """The largest rank's peak: static states + ZeRO-3 gathers + its most held activations."""
    p = scenario.parallel
    order = rank_order(scenario.schedule, p.pp, scenario.num_microbatches, p.virtual)
    where = placement(scenario.schedule, p.pp, p.virtual)
    peaks = []
    for rank in range(p.pp):
        stages = sorted(s for s, r in where.items() if r == rank)
        static = sum(
            sum(model_state_bytes(stage_params(scenario, s), p.zero, p.dp, grad_bytes=scenario.gradient_bytes).values())
            for s in stages
        )
        gather = gathered_peak_bytes(scenario, order[rank]) if p.zero == 3 and p.dp > 1 else 0.0
        held = {
            s: stage_activation_bytes(scenario, s, s < p.num_stages - 1 and where.get(s + 1) != rank) for s in stages
        }
        frees = {s: stage_input_gradient_bytes(scenario, s) for s in stages}
        peaks.append(static + gather + peak_held_bytes(order[rank], held, frees))
    return max(peaks)


def estimate(scenario: Scenario, fabric: Fabric, memory: float | None = None) -> Estimate:
    """Memory peak (`memory`, if the caller has it already) and estimated step time (module docstring)."""
    memory = memory_peak_bytes(scenario) if memory is None else memory
    capacity = scenario.gpu_spec.memory_bytes
    pp = scenario.parallel.pp
    # the embedding's rank, a middle one (neither embedding nor head: all the middle ones alike), the head's
    kinds = sorted({0, pp // 2, pp - 1})
    ranks = {r: _rank_times(scenario, fabric, r) for r in kinds}
    kind_of = [r if r in (0, pp - 1) else pp // 2 for r in range(pp)]
    slowest = max(kinds, key=lambda r: ranks[r][0] + ranks[r][1])
    f, b, _ = ranks[slowest]
    # every rank played at the slowest rank's chunk times, less what the others spend short of it:
    # a pipeline's fill and drain pass each rank once (exact for one chunk per rank, GPipe and 1F1B)
    shortfall = sum(f + b - ranks[kind_of[r]][0] - ranks[kind_of[r]][1] for r in range(pp) if r != slowest)
    ratio = round(b / f, 2)  # the played makespan scales with f at a fixed b / f: one play per ratio
    p = scenario.parallel
    played = f * play(scenario.schedule, pp, scenario.num_microbatches, p.virtual, 1.0, ratio).makespan
    pipeline_s = max(played - shortfall, scenario.num_microbatches * p.virtual * (f + b))
    return Estimate(pipeline_s + max(ranks[r][2] for r in sorted({0, pp - 1})), memory, capacity)


_FABRICS: dict[str, Fabric] = {}  # per process (a Dask worker's): each cluster's collectives timed once


def fabric_of(scenario: Scenario) -> Fabric:
    """The Fabric of the scenario's cluster, built once per process."""
    key = scenario.cluster.model_dump_json()
    if key not in _FABRICS:
        _FABRICS[key] = Fabric(build_topology(scenario))
    return _FABRICS[key]


def estimate_chunk(data: dict, filename: str, chunk: list[dict]) -> list[float | None]:
    """On a worker: each candidate's (overrides of `data`) estimated step time, or None when its
    memory peak exceeds the GPU's (so it is never simulated)."""
    steps: list[float | None] = []
    for overrides in chunk:
        scenario = scenario_of(data, overrides, filename)
        memory = memory_peak_bytes(scenario)
        fits = memory <= scenario.gpu_spec.memory_bytes
        steps.append(estimate(scenario, fabric_of(scenario), memory).step_time_s if fits else None)
    return steps


def _stages_of(scenario: Scenario, rank: int) -> list[int]:
    p = scenario.parallel
    return [chunk * p.pp + rank for chunk in range(p.virtual)]


def _rank_times(scenario: Scenario, fabric: Fabric, rank: int) -> tuple[float, float, float]:
    """A pipeline rank's (forward, backward) of one chunk, its mean over its chunks, and what its
    step adds after the pipeline: the exposed data parallelism and the optimizer."""
    p, m, t, gpu = scenario.parallel, scenario.model_spec, scenario.training, scenario.gpu_spec
    layout = layout_of(scenario)
    stages = _stages_of(scenario, rank)
    act_bytes = cost.boundary_activation_bytes(t.micro_batch, m.seq_len, m.hidden, scenario.dtype_bytes)
    tp_s = fabric.seconds("all_reduce", layout.tp_group(0, rank), act_bytes)
    a2a_s = fabric.seconds("all_to_all", layout.ep_group(0, rank, 0), alltoall_bytes(scenario), ep_algorithm(scenario))
    p2p_bytes = act_bytes / p.tp if p.sequence_parallel else act_bytes
    neighbour = layout.pp_group(0, 0)[(rank + 1) % p.pp]
    send_s = fabric.seconds("p2p", (layout.pp_group(0, 0)[rank], neighbour), p2p_bytes) if p.pp > 1 else 0.0
    kernels = KernelTimes(scenario) if scenario.cluster.compute_model == "kernel" else None
    forward = backward = 0.0
    for s in stages:
        flops = stage_forward_flops(scenario, s)
        redo = sum(
            cost.model_layer_recompute_flops(m, t.micro_batch, i, t.recompute) for i in stage_layer_range(scenario, s)
        )
        layers, moe = len(stage_layer_range(scenario, s)), sum(stage_moe_layers(scenario, s))
        comm_back = layers * tp_s * (4 if t.recompute == "full" else 2) + 2 * moe * a2a_s
        if kernels is not None:  # cluster.compute_model: kernel, as the run will time them
            forward_s, backward_s = kernels.whole_op_s(Phase.F, s), kernels.whole_op_s(Phase.B, s)
        else:
            forward_s, backward_s = _compute_s(scenario, flops), _compute_s(scenario, 2 * flops + redo / p.tp)
        forward += forward_s + layers * 2 * tp_s + 2 * moe * a2a_s + send_s
        backward += backward_s + comm_back + send_s
    f, b = forward / p.virtual, backward / p.virtual  # one chunk's mean
    dp_group = layout.dp_group(rank, 0)
    grads = sum(weight_bytes(scenario, s) for s in stages)  # the weights' bytes; reduced at gradient_bytes each
    reduce_bytes = grads * scenario.gradient_bytes / 2.0
    reduce_s = fabric.seconds("all_reduce" if p.zero == 0 else "reduce_scatter", dp_group, reduce_bytes)
    exposed = max(0.0, reduce_s - b * p.virtual)
    if p.zero in (1, 2):
        exposed += fabric.seconds("all_gather", dp_group, grads)
    if p.zero == 3:
        gather_s = fabric.seconds("all_gather", dp_group, grads / p.virtual)
        exposed += scenario.num_microbatches * p.virtual * (max(0.0, gather_s - f) + max(0.0, gather_s - b))
    params = sum(stage_params(scenario, s) for s in stages) / (p.dp if p.zero >= 1 else 1)
    optimizer_s = cost.memory_time_s(params * cost.ADAM_BYTES_PER_PARAM, gpu.hbm_bandwidth_Bps)
    return f, b, exposed + optimizer_s


def _compute_s(scenario: Scenario, flops: float) -> float:
    gpu = scenario.gpu_spec
    return cost.compute_time_s(flops, gpu.peak_flops, gpu.efficiency)
