"""What every pipeline schedule generator shares: a rank's compute order, the stage placements,
and the error a generator raises for sizes it cannot schedule.

A generator `(num_ranks, num_microbatches, virtual) -> RankOrder` returns
`rank -> [(phase, microbatch, stage), ...]`. Phase B is the input gradient when the order also
holds a W (weight gradient) for the same (microbatch, stage), else the whole backward.
"""

from __future__ import annotations

from collections.abc import Callable

from clustersim.schedules.ir import Phase

Step = tuple[Phase, int, int]  # (phase F | B | W, microbatch, global stage)
RankOrder = dict[int, list[Step]]  # rank -> its compute order
Generator = Callable[[int, int, int], RankOrder]  # (num_ranks, num_microbatches, virtual) -> RankOrder
Placement = Callable[[int, int], dict[int, int]]  # (num_ranks, virtual) -> stage -> rank
F, B, W = Phase.F, Phase.B, Phase.W


class ScheduleError(ValueError):
    """A schedule cannot run these sizes; `knob` names the size at fault ("virtual" or
    "microbatches"), so a caller can point at its own spelling of it (a flag, a YAML path)."""

    def __init__(self, knob: str, message: str):
        super().__init__(message)
        self.knob = knob


def stage_ranks(num_ranks: int, virtual: int = 1) -> dict[int, int]:
    """Looped placement: chunk c of rank r is global stage c x num_ranks + r (v = 1: stage s on rank s)."""
    return {chunk * num_ranks + rank: rank for chunk in range(virtual) for rank in range(num_ranks)}


def v_stage_ranks(num_ranks: int, virtual: int = 2) -> dict[int, int]:
    """V placement (ZB-V, DualPipeV; PyTorch's `generate_stage_to_rank_mapping(style="v")`): rank r
    holds stage r and stage 2p - 1 - r, so the forward runs down the ranks and back up, and the
    last stage sits on rank 0 next to the first. Needs virtual = 2."""
    if virtual != 2:
        raise ScheduleError(
            "virtual", f"the V placement holds exactly 2 chunks per rank: virtual must be 2, got {virtual}"
        )
    last = 2 * num_ranks - 1
    return {stage: min(stage, last - stage) for stage in range(2 * num_ranks)}


def split_steps(order: RankOrder) -> set[tuple[int, int]]:
    """(microbatch, stage) pairs whose backward is split: their B is the input gradient alone."""
    return {(mb, stage) for steps in order.values() for phase, mb, stage in steps if phase == W}
