"""One run, in explicit phases: build (sim.build: topology, program, numerics; sim.scale: the
Scale and its network), run (the engine), post-process (metrics into a summary). Writing files is
sim.report's job; this module returns data only, so a notebook gets the same numbers as the CLI.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx

from clustersim.schedules.ir import Program
from clustersim.sim.build import (
    build_topology,
    compute_time_fn,
    make_numerics,
    program_of,
    replica_placements,
    symmetry_of,
)
from clustersim.sim.collector import collector_paused
from clustersim.sim.cost.memory import model_state_bytes
from clustersim.sim.cost.stages import stage_activation_bytes, stage_input_gradient_bytes, stage_params
from clustersim.sim.engine.loop import run_program
from clustersim.sim.engine.records import EventLog
from clustersim.sim.results.memory import MemoryTimeline, memory_timeline
from clustersim.sim.results.stragglers import straggler_summary
from clustersim.sim.results.summary import summarize
from clustersim.sim.scale.execution import Symmetric, make_scale
from clustersim.sim.scenario.schema import Scenario


@dataclass(frozen=True)
class RunResult:
    """Everything one run produced: the scenario, the program it ran, the log, and the summary."""

    scenario: Scenario
    program: Program
    graph: nx.DiGraph
    log: EventLog
    memory: MemoryTimeline
    summary: dict


def simulate(
    scenario: Scenario,
    on_progress: Callable[[int], None] | None = None,
    program: Program | None = None,
    exact: bool = False,
) -> RunResult:
    """Build, run and post-process one scenario (`on_progress`: see sim.engine.run_program;
    `program`: one already made by program_of or make_program; `exact`: walk every rank and move every
    collective's flows, no symmetry (sim.scale.symmetry) and no replays (sim.scale.shortcut), for checking
    that those change nothing)."""
    with collector_paused():  # all of it lives on in the RunResult (sim.collector)
        # build
        program = program or program_of(scenario, exact)
        graph = build_topology(scenario)
        scale = make_scale(program, graph, symmetry_of(scenario), replays=not exact)
        numerics = make_numerics(scenario)
        # run
        log = run_program(
            program, scale.network, compute_time_fn(scenario), numerics=numerics, on_progress=on_progress, scale=scale
        )
        # post-process
        memory = memory_of(scenario, log)
        summary = summarize(scenario, program, log, memory, numerics.finish() if numerics else None, scale.symmetry)
        summary["replayed_groups"] = scale.replayed_groups
        if isinstance(scale, Symmetric):
            summary["symmetry"]["messages_per_flow"] = scale.messages_per_flow
        summary |= straggler_summary(log)
        return RunResult(scenario, program, graph, log, memory, summary)


def memory_of(scenario: Scenario, log: EventLog) -> MemoryTimeline:
    """Memory over time per rank: ZeRO-sharded model states of the stages a rank holds, the
    activations each stage keeps per in-flight microbatch (sim.cost.stages.stage_activation_bytes:
    its layers', the embedding's or the LM head's, its output while sent; the loss's freed by a split
    backward's B, sim.cost.stages.stage_input_gradient_bytes), ZeRO-3's gathered units."""
    p = scenario.parallel
    static: dict[int, dict[str, float]] = {}
    activations: dict[int, dict[int, float]] = {}
    backward_frees: dict[int, dict[int, float]] = {}
    for placement in replica_placements(scenario):
        for stage, rank in placement.items():
            states = model_state_bytes(stage_params(scenario, stage), p.zero, p.dp, grad_bytes=scenario.gradient_bytes)
            static[rank] = {k: static.get(rank, {}).get(k, 0.0) + v for k, v in states.items()}
            sends = stage < p.num_stages - 1 and placement.get(stage + 1) != rank
            activations.setdefault(rank, {})[stage] = stage_activation_bytes(scenario, stage, sends)
            backward_frees.setdefault(rank, {})[stage] = stage_input_gradient_bytes(scenario, stage)
    return memory_timeline(log, static, activations, zero3=p.zero == 3 and p.dp > 1, backward_frees=backward_frees)
