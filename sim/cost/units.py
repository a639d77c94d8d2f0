"""ZeRO-3 units (FSDP's wrapping units) in numbers: which layers each unit of a stage holds, its
weight bytes on one rank, and the closed form of the gathered weights' peak (schedules.zero3).

A stage of L layers in units of u layers has ceil(L / u) units, unit k the layers [k u, (k+1) u)
of the stage (the last one shorter when u does not divide L); the embeddings belong to the first
unit of stage 0, the final layernorm and LM head to the last unit of the last stage, as FSDP's
root unit keeps them beside the first and last layers.
"""

from __future__ import annotations

from clustersim.schedules.zero3 import unit_ranges
from clustersim.sim.cost.stages import layers_params, stage_layer_range
from clustersim.sim.scenario.schema import Scenario


def stage_units(scenario: Scenario, stage: int) -> list[range]:
    """The layers of each unit of a stage (parallel.zero3_unit_layers per unit)."""
    return unit_ranges(stage_layer_range(scenario, stage), scenario.parallel.zero3_unit_layers)


def unit_weight_bytes(scenario: Scenario, stage: int, unit: int) -> float:
    """Bytes of a unit's 16-bit weights on one rank (= its gradients'): what its all-gather
    brings and its reduce-scatter reduces."""
    units = stage_units(scenario, stage)
    last = scenario.parallel.num_stages - 1
    embed, head = stage == 0 and unit == 0, stage == last and unit == len(units) - 1
    return layers_params(scenario, units[unit], embed, head) * 2.0


def peak_gathered_bytes(unit_bytes: list[float], prefetch: int) -> float:
    """The most gathered weights a rank holds at once when it uses units of `unit_bytes` (in
    compute order) with `prefetch` units gathered ahead: the largest sum of prefetch + 1
    consecutive uses (schedules.zero3; fewer uses than that: all of them)."""
    window = min(prefetch + 1, len(unit_bytes))
    return max(sum(unit_bytes[i : i + window]) for i in range(len(unit_bytes) - window + 1))
