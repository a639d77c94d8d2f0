"""A pipeline schedule played out with fixed op times, no network: the planner's estimate of a
schedule's makespan and of the microbatch activations each rank holds at its peak.

Any schedule of the registry (schedules.pipeline.SCHEDULES) works, new ones included: the rank
orders come from the schedule itself, and the rules are the data dependencies of a pipeline:

    F(mb, s)  after F(mb, s - 1)               (its input activation)
    B(mb, s)  after F(mb, s) and B(mb, s + 1)  (the gradient of its output; the last stage's loss)
    W(mb, s)  after B(mb, s)                   (a split backward's weight gradient)

each also after the rank's previous op. A stage keeps a microbatch's activations from its forward
until the last backward op (B, or W when split) of that microbatch on that stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from clustersim.schedules.ir import Phase
from clustersim.schedules.pipeline import Step, rank_order


@dataclass(frozen=True)
class Played:
    """`makespan`: the schedule's length in the unit of the op times given; `peak_inflight`:
    per rank, the most (microbatch, stage) activations held at once."""

    makespan: float
    peak_inflight: tuple[int, ...]


@lru_cache(maxsize=4096)
def play(kind: str, pp: int, microbatches: int, virtual: int, forward: float, backward: float) -> Played:
    """Play `kind`'s rank orders with every forward taking `forward` and every backward
    `backward` (split into B and W halves where the schedule splits it)."""
    order = rank_order(kind, pp, microbatches, virtual)
    split = any(phase == Phase.W for steps in order.values() for phase, _, _ in steps)
    cost = {Phase.F: forward, Phase.B: backward / 2 if split else backward, Phase.W: backward / 2}
    last_stage = pp * virtual - 1
    done: dict[Step, float] = {}
    position = dict.fromkeys(order, 0)
    free_at = dict.fromkeys(order, 0.0)
    remaining = sum(len(steps) for steps in order.values())
    while remaining:
        progressed = False
        for rank, steps in order.items():
            while position[rank] < len(steps):
                phase, mb, stage = step = steps[position[rank]]
                needs = _needs(phase, mb, stage, last_stage)
                if any(need not in done for need in needs):
                    break
                start = max([free_at[rank], *(done[need] for need in needs)])
                done[step] = free_at[rank] = start + cost.get(phase, 0.0)
                position[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # a registered schedule passes the validator's deadlock check: never here
            raise ValueError(f"schedule {kind!r} (pp {pp}, m {microbatches}, v {virtual}) deadlocks")
    return Played(max(free_at.values()), tuple(_peak_inflight(order[rank]) for rank in sorted(order)))


def _needs(phase: Phase, mb: int, stage: int, last_stage: int) -> tuple[Step, ...]:
    if phase == Phase.F:
        return ((Phase.F, mb, stage - 1),) if stage > 0 else ()
    if phase == Phase.B:
        own = (Phase.F, mb, stage)
        return (own, (Phase.B, mb, stage + 1)) if stage < last_stage else (own,)
    if phase == Phase.W:
        return ((Phase.B, mb, stage),)
    return ()


def _peak_inflight(steps: list[Step]) -> int:
    """Most (microbatch, stage) pairs between their forward and their last backward op at once."""
    return round(peak_held_bytes(steps, dict.fromkeys({stage for _, _, stage in steps}, 1.0)))


def peak_held_bytes(
    steps: list[Step], stage_bytes: dict[int, float], backward_frees: dict[int, float] | None = None
) -> float:
    """Most bytes a rank holds at once in its order `steps`: a (microbatch, stage) holds
    `stage_bytes[stage]` from its forward until its last backward op (B, or W when split), which
    frees them before the rank's next forward counts (as sim.results.memory's timeline does);
    `backward_frees[stage]` of them go at B already when a W follows."""
    last = {(mb, stage): i for i, (phase, mb, stage) in enumerate(steps) if phase != Phase.F}
    early = backward_frees or {}
    held = peak = 0.0
    for i, (phase, mb, stage) in enumerate(steps):
        if phase == Phase.F:
            held += stage_bytes[stage]
            peak = max(peak, held)
        elif last.get((mb, stage)) == i:
            held -= stage_bytes[stage] - (early.get(stage, 0.0) if phase == Phase.W else 0.0)
        elif phase == Phase.B:  # a W follows
            held -= early.get(stage, 0.0)
    return peak
