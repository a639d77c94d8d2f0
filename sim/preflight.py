"""Will this run fit? The ops and memory of a scenario, estimated before anything big is built.

A run's memory is its program (the walked ranks' ops), the spans the engine records for them and
the flows the network solves: all three grow with the number of walked ops, so memory is

    bytes ~ BASE_BYTES + ops x BYTES_PER_OP

with both constants measured on this engine (`python bench/preflight.py` prints estimate against
measured peak RSS for a spread of scenarios). The op count is not guessed from a formula that
would drift from the schedule generators: it is counted. A program's ops grow affinely in the
microbatches m and in the layers L, with an m x L term (tensor-parallel collectives per layer per
microbatch), so four tiny programs built the real way, at m in {m1, 2 m1} and L in {L1, 2 L1},
fix the four coefficients of

    ops(m, L) = a + b m + c L + d m L

and the real (m, L) is read off it. Only one pipeline is built: every pipeline (one per data-parallel
replica and tensor-parallel shard) has as many ops, so the run's are that times the pipelines it
walks (all, or those of a symmetric run's representatives).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from clustersim.schedules.pipeline import SCHEDULES
from clustersim.sim.build import layout_of, make_program, pipelines_of, symmetry_of
from clustersim.sim.collector import collector_paused
from clustersim.sim.scenario.schema import Scenario

BASE_BYTES = 100e6  # the interpreter, numpy, networkx, simpy and a small fabric: 70-110 MB measured
# An op, its spans and its flows, from peak RSS above the base (bench/preflight.py, 2026-11-25):
# 1.45 kB on a 1,024-GPU GPT-3 run and on a 1,536-GPU one walking all 192 replicas, 2.75 kB on a
# symmetric 1,536-GPU run (each walked op moves its images' flows). The largest, so the estimate errs high.
BYTES_PER_OP = 2.75e3
DEFAULT_SHARE = 0.8  # of the memory available when the run starts


@dataclass(frozen=True)
class Estimate:
    """What a run will hold: its walked ranks, their ops, and the bytes that takes."""

    walked_ranks: int
    ops: int

    @property
    def bytes(self) -> float:
        return BASE_BYTES + self.ops * BYTES_PER_OP


def estimate(scenario: Scenario) -> Estimate:
    """The run's walked ranks and ops, from four tiny programs (see the module docstring)."""
    symmetry = symmetry_of(scenario)
    walked = len(symmetry.representatives) if symmetry is not None else scenario.num_gpus
    p = scenario.parallel
    one_pipeline = pipelines_of(layout_of(scenario))[0]  # every pipeline has as many ops as this one
    stages = p.pp * p.virtual
    m1 = SCHEDULES[scenario.schedule].fewest_microbatches(scenario.schedule, p.pp, p.virtual)
    l1 = stages * max(1, -(-_first_dense(scenario) // stages) + 1)  # past the dense head of a MoE model
    counts = {
        (m, layers): _ops(_resized(scenario, m, layers), one_pipeline) for m in (m1, 2 * m1) for layers in (l1, 2 * l1)
    }
    d = (counts[2 * m1, 2 * l1] - counts[2 * m1, l1] - counts[m1, 2 * l1] + counts[m1, l1]) / (m1 * l1)
    b = (counts[2 * m1, l1] - counts[m1, l1]) / m1 - d * l1
    c = (counts[m1, 2 * l1] - counts[m1, l1]) / l1 - d * m1
    a = counts[m1, l1] - b * m1 - c * l1 - d * m1 * l1
    m, layers = scenario.num_microbatches, scenario.model_spec.layers
    per_pipeline = max(0.0, a + b * m + c * layers + d * m * layers)
    return Estimate(walked, round(per_pipeline * walked / p.pp))


def available_bytes() -> float:
    """Memory the machine has free now (Linux: MemAvailable), else its physical memory."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def default_limit_bytes() -> float:
    return DEFAULT_SHARE * available_bytes()


def refusal(scenario: Scenario, limit_bytes: float) -> str | None:
    """Why the run would not fit in `limit_bytes` (one line naming the knobs that drive it), or None."""
    est = estimate(scenario)
    if est.bytes <= limit_bytes:
        return None
    return (
        f"this run would need about {est.bytes / 1e9:.3g} GB ({est.ops:,} ops on {est.walked_ranks:,} walked ranks: "
        f"{scenario.num_microbatches:,} microbatches x {scenario.model_spec.layers:,} layers), over the limit of "
        f"{limit_bytes / 1e9:.3g} GB; lower training.global_batch or model.layers, or raise the limit with --max-memory"
    )


def _first_dense(scenario: Scenario) -> int:
    moe = scenario.model_spec.moe
    return moe.first_dense if moe is not None else 0


def _resized(scenario: Scenario, microbatches: int, layers: int) -> Scenario:
    """The scenario with `microbatches` per replica and `layers` layers split evenly (a multiple of
    the stages: an uneven parallel.stage_layers is dropped), all else the same."""
    t = scenario.training
    training = t.model_copy(update={"global_batch": t.micro_batch * scenario.parallel.dp * microbatches})
    parallel = scenario.parallel.model_copy(update={"stage_layers": None})
    model = scenario.model.model_copy(update={"layers": layers})
    return scenario.model_copy(update={"training": training, "model": model, "parallel": parallel})


def _ops(scenario: Scenario, pipeline: tuple[int, ...]) -> int:
    """The ops of one pipeline's ranks in the scenario's program (made with the collector paused,
    as the run's is: on a big run these samples are a pipeline's worth of ops, sim.collector)."""
    with collector_paused(keep=False):
        return sum(len(ops) for ops in make_program(scenario, pipeline[:1], check=False).ops.values())
