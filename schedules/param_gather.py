"""The sharded optimizer's parameter all-gather overlapped with the next step's forward, as Apex's
DistributedFusedAdam does it with overlap_param_sync (what NeMo runs) and Megatron-LM's distributed
optimizer with --overlap-param-gather: each gradient bucket's weights are gathered just ahead of
the first forward that needs them, one bucket in flight at a time.

Apex (apex/contrib/optimizers/distributed_fused_adam.py, `step`): "Overlap param sync of first
buckets with optimizer step of remaining buckets": the bucket holding the model's first parameter
is stepped first and its all-gather started while the other buckets step. A parameter's
pre-forward hook waits for its bucket (`_param_copy`) and starts the next one
(`_try_start_bucket_param_sync`) on a side stream that first waits for the compute issued so far
(`comm_stream.wait_stream(main_stream)`). Megatron-LM core_r0.8.0 (megatron/core/optimizer/
distrib_optimizer.py) chains the buckets the same way (`_finish_param_sync_helper`: "We can't
pre-launch all-gathers for all buckets at once since we don't want to head-of-line block the
compute kernels") but dispatches the first in `zero_grad`, after the step.

One step is simulated, so the steady state is drawn. With the buckets of a rank's stages ordered
by their first forward use (u_0, u_1, ...): gather 0 runs for the next step once the optimizer
step of u_0's stage has updated it, beside the rank's other stages' steps (a stage's step is one
op: with one stage the gather follows the whole step, where Apex starts it after the first
bucket's share), and use 0 needs nothing (the previous step's gather 0 brought it); gather j >= 1
runs on the "dp" stream after gather j - 1 and the compute before use j - 1 (Apex's
wait_stream), so it starts as use j - 1 does, and use j waits for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from clustersim.schedules.ir import Compute, Op, Phase
from clustersim.schedules.order import RankOrder
from clustersim.schedules.zero3 import UnitStarts, unit_uses


class BucketUse(NamedTuple):
    """The first forward piece of a rank that uses a bucket's weights, and the compute before it."""

    stage: int
    bucket: int
    first: str  # label of the piece the bucket's first unit starts in
    before: tuple[str, ...]  # label of the op before it on its stream (none when it is the first)


def first_forward_uses(
    rank_ops: list[Op], unit_starts: UnitStarts, buckets: Callable[[int], list[range]]
) -> list[BucketUse]:
    """Each (stage, bucket) of the rank's forwards once, in the order the forwards first use them.
    `buckets(stage)`: the units of each bucket (schedules.zero3.unit_buckets), first to last; a
    bucket is first needed where its first unit starts."""
    phase_of = {op.label: op.phase for op in rank_ops if isinstance(op, Compute)}
    previous = _previous_on_stream(rank_ops)
    seen: set[tuple[int, int]] = set()
    uses: list[BucketUse] = []
    for use in unit_uses(rank_ops, unit_starts):
        if phase_of[use.first] != Phase.F:
            continue
        for b, units in enumerate(buckets(use.stage)):
            if units[0] == use.unit and (use.stage, b) not in seen:
                seen.add((use.stage, b))
                uses.append(BucketUse(use.stage, b, use.first, previous[use.first]))
    return uses


def first_forward_stages(order: RankOrder) -> frozenset[int]:
    """The stages of every pipeline rank's first forward, whose first bucket the previous step's
    optimizer gathered."""
    return frozenset(next(stage for phase, _, stage in steps if phase == Phase.F) for steps in order.values())


def _previous_on_stream(rank_ops: list[Op]) -> dict[str, tuple[str, ...]]:
    """label -> (label of the op before it on its stream,), or () for a stream's first op."""
    previous: dict[str, tuple[str, ...]] = {}
    last_on: dict[str, tuple[str, ...]] = {}
    for op in rank_ops:
        previous[op.label] = last_on.get(op.stream, ())
        last_on[op.stream] = (op.label,)
    return previous
