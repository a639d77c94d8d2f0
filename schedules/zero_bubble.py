"""Zero-bubble schedules (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv:2401.10241):
the backward split into B, the input gradient the previous stage waits for, and W, the weight
gradient nobody waits for, which is slid into what would be bubbles.

With p ranks, m microbatches, equal times F = B = W and free communication:

ZB-H1 (paper sec 2.1): 1F1B's warm-up (rank r: p - r - 1 forwards), but rank r runs its first r
steady-state B's without their W's; those W's fill the cool-down. The bubble shrinks from 1F1B's
(p - 1)(F + B + W) to (p - 1)(F + B - W), a third of it when the three are equal, and no rank holds
more than p microbatches (1F1B's rank 0). It is PyTorch's ScheduleInterleavedZeroBubble ("ZB1P")
with one stage per rank, which this module's generators follow step for step.

Interleaved zero bubble (PyTorch's ScheduleInterleavedZeroBubble): Megatron's interleaving in
rounds of m / max(1, m // p) microbatches, rank r warming up with (v - 1) x round + (p - 1 - r)
forwards, then F, B and (after its first r steady steps) the oldest pending W, then B and W to
drain; chunk c of rank r is stage c x p + r.

ZB-V (paper sec 6, PyTorch's ScheduleZBVZeroBubble): two chunks per rank in a V (schedules.order
.v_stage_ranks), rank r runs 2 (p - r) - 1 forwards of its first chunk, r pairs of both chunks,
p - r of (F, B, W) on the second chunk, then alternates both chunks' F, B, W. Once m >= 2p - 1
(PyTorch plans that many so the V fills) its only bubble is the fill, (p - 1) F / 2, which does
not grow with m; its peak activation memory is 1F1B's (2p chunk-microbatches of half a stage each).
"""

from __future__ import annotations

from collections import defaultdict

from clustersim.schedules.order import B, F, RankOrder, ScheduleError, Step, W


def rounds_of(num_ranks: int, num_microbatches: int) -> tuple[int, int]:
    """(rounds, microbatches per round) of PyTorch's interleaved zero bubble: max(1, m // p) rounds."""
    rounds = max(1, num_microbatches // num_ranks)
    return rounds, num_microbatches // rounds


def interleaved_zb_sizes(kind: str, num_ranks: int, num_microbatches: int, virtual: int) -> None:
    """virtual >= 1, and m a whole number of rounds (PyTorch's rule)."""
    if virtual < 1:
        raise ScheduleError("virtual", f"{kind} schedule needs virtual >= 1, got {virtual}")
    rounds, _ = rounds_of(num_ranks, num_microbatches)
    if num_microbatches % rounds:
        raise ScheduleError(
            "microbatches",
            f"{kind} schedule needs microbatches ({num_microbatches}) to be a multiple of its rounds "
            f"({rounds} = max(1, microbatches // pp))",
        )


def zb_h1_sizes(kind: str, num_ranks: int, num_microbatches: int, virtual: int) -> None:
    """One stage per rank; any number of microbatches (with one chunk the rounds change nothing)."""
    if virtual != 1:
        raise ScheduleError("virtual", f"schedule {kind!r} runs one stage per rank: virtual must be 1, got {virtual}")


def interleaved_zb_order(num_ranks: int, num_microbatches: int, virtual: int = 1) -> RankOrder:
    """Each rank's F, B (input gradient) and W order, as PyTorch's ScheduleInterleavedZeroBubble
    builds it (module docstring); each stage numbers its own microbatches in the order it meets them."""
    interleaved_zb_sizes("interleaved-zb", num_ranks, num_microbatches, virtual)
    return _zero_bubble_order(num_ranks, num_microbatches, virtual)


def zb_h1_order(num_ranks: int, num_microbatches: int, virtual: int = 1) -> RankOrder:
    """ZB-H1: interleaved zero bubble with one stage per rank (module docstring)."""
    zb_h1_sizes("zb-h1", num_ranks, num_microbatches, virtual)
    return _zero_bubble_order(num_ranks, num_microbatches, 1)


def _zero_bubble_order(num_ranks: int, num_microbatches: int, virtual: int) -> RankOrder:
    """PyTorch's `_get_1f1b_rank_ops` with zero bubble on: F, B, then the oldest held-back W."""
    p, v = num_ranks, virtual
    _, per_round = rounds_of(p, num_microbatches)
    total = v * num_microbatches
    order: RankOrder = {}
    for rank in range(p):
        warmup = min((v - 1) * per_round + (p - 1 - rank), total)

        def forward_stage(k: int, rank: int = rank) -> int:
            return (k // per_round) % v * p + rank

        def backward_stage(k: int, rank: int = rank, warmup: int = warmup) -> int:
            return (v - 1 - (k - warmup) // per_round % v) * p + rank

        count: dict[tuple[str, int], int] = defaultdict(int)  # (phase, stage) -> next microbatch

        def step(phase, stage: int, count=count) -> Step:
            mb = count[(phase, stage)]
            count[(phase, stage)] += 1
            return (phase, mb, stage)

        ops: list[Step] = []
        backwards: list[int] = []  # the step index k of each B, oldest first: W follows them
        weights = 0  # W's run so far
        for k in range(total + warmup):
            if k < total:
                ops.append(step(F, forward_stage(k)))
            if k >= warmup:
                ops.append(step(B, backward_stage(k)))
                backwards.append(k)
                if k - warmup >= rank:  # rank r holds back its first r W's
                    ops.append(step(W, backward_stage(backwards[weights])))
                    weights += 1
        ops.extend(step(W, backward_stage(k)) for k in backwards[weights:])
        order[rank] = ops
    return order


def v_sizes(kind: str, num_ranks: int, num_microbatches: int, virtual: int) -> None:
    """Two chunks per rank, in a V."""
    if virtual != 2:
        raise ScheduleError(
            "virtual", f"schedule {kind!r} runs two chunks per rank in a V: virtual must be 2, got {virtual}"
        )


def zbv_order(num_ranks: int, num_microbatches: int, virtual: int = 2) -> RankOrder:
    """ZB-V as PyTorch's ScheduleZBVZeroBubble builds it (module docstring). It plans
    max(2p - 1, m) microbatches so the V fills, then drops the ones beyond m."""
    v_sizes("zbv", num_ranks, num_microbatches, virtual)
    p, m = num_ranks, num_microbatches
    planned = max(2 * p - 1, m)
    order: RankOrder = {}
    for rank in range(p):
        down, up = rank, 2 * p - 1 - rank  # the rank's chunk on the way down and on the way up
        count: dict[tuple[str, int], int] = defaultdict(int)
        ops: list[Step] = []

        def run(*steps: tuple, count=count, ops=ops) -> None:
            """Append (phase, stage) steps, each stage numbering its microbatches per phase."""
            for phase, stage in steps:
                ops.append((phase, count[(phase, stage)], stage))
                count[(phase, stage)] += 1

        run(*[(F, down)] * (2 * (p - rank) - 1))
        run(*[(F, up), (F, down)] * rank)
        run(*[(F, up), (B, up), (W, up)] * (p - rank))
        while count[(F, up)] < count[(F, down)] or count[(F, down)] < planned:
            if count[(F, down)] < planned:
                run((F, down))
            run((B, down), (W, down), (F, up), (B, up), (W, up))
        run(*[(B, down), (B, up)] * rank)
        run(*[(B, down), (W, down)] * (p - rank))
        for stage in (up, down):
            run(*[(W, stage)] * (count[(B, stage)] - count[(W, stage)]))
        order[rank] = [op for op in ops if op[1] < m]
    return order
