"""The sharded optimizer's parameter all-gather overlapped with the next step's forward, as
Megatron-LM's distributed optimizer (--overlap-param-gather) and Apex's DistributedFusedAdam
(overlap_param_sync, what NeMo runs) do it: each gradient bucket's weights are gathered just
ahead of the first forward that needs them, one bucket in flight at a time.

Megatron-LM core_r0.8.0, megatron/core/optimizer/distrib_optimizer.py: `zero_grad` dispatches
the first bucket's all-gather before the forward; the forward pre-hook of a module waits for its
bucket's all-gather and then dispatches the next bucket's (`_finish_param_sync_helper`: "We
can't pre-launch all-gathers for all buckets at once since we don't want to head-of-line block
the compute kernels", CUDA_DEVICE_MAX_CONNECTIONS=1). Apex (apex/contrib/optimizers/
distributed_fused_adam.py): a parameter's pre-forward hook waits for its bucket
(`_param_copy`) and starts the next (`_try_start_bucket_param_sync`), on a side stream that
first waits for the compute issued so far (`comm_stream.wait_stream(main_stream)`).

One step is simulated, so the steady state is drawn: the gathers of the previous step's update
run at this step's start on the "dp" stream. With the buckets of a rank's stages ordered by
their first forward use (u_0, u_1, ...), gather 0 has no dependency; the piece where use j
starts waits for gather j; gather j + 1 waits for gather j (the stream's order) and for the
compute before use j (Apex's wait_stream), so it starts as use j does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from clustersim.schedules.ir import Compute, Op, Phase
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
    previous: dict[str, tuple[str, ...]] = {}
    last_on: dict[str, tuple[str, ...]] = {}
    for op in rank_ops:
        previous[op.label] = last_on.get(op.stream, ())
        last_on[op.stream] = (op.label,)
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
