"""Pipeline schedules: the order in which each stage runs its microbatches' forwards and backwards.

A generator returns `stage -> [(phase, microbatch), ...]`; `build_program` then inserts the
point-to-point sends and receives between neighbouring stages and the optimizer step, giving a
Program every generator shares.

GPipe (Huang et al. 2019): every forward, then every backward. A stage holds the activations of
all m microbatches at once.

1F1B, PipeDream-flush (Narayanan et al. 2021): stage r runs min(p - r - 1, m) warm-up forwards,
then alternates one forward and one backward (steady state), then drains the remaining backwards
(cool-down). Same bubble as GPipe, (p - 1) / (m + p - 1), but at most min(p - r, m) microbatches
in flight on stage r.
"""

from __future__ import annotations

from collections.abc import Callable

from schedules.ir import Compute, Op, Program, Recv, Send

StageOrder = dict[int, list[tuple[str, int]]]


def gpipe_order(num_stages: int, num_microbatches: int) -> StageOrder:
    """All forwards in microbatch order, then all backwards in microbatch order."""
    forwards = [("F", mb) for mb in range(num_microbatches)]
    backwards = [("B", mb) for mb in range(num_microbatches)]
    return {stage: forwards + backwards for stage in range(num_stages)}


def one_f_one_b_order(num_stages: int, num_microbatches: int) -> StageOrder:
    """PipeDream-flush: warm-up forwards, steady one-forward-one-backward, cool-down backwards."""
    order: StageOrder = {}
    for stage in range(num_stages):
        warmup = min(num_stages - stage - 1, num_microbatches)
        ops = [("F", mb) for mb in range(warmup)]  # warm-up
        for i in range(num_microbatches - warmup):  # steady 1F1B
            ops += [("F", warmup + i), ("B", i)]
        ops += [("B", mb) for mb in range(num_microbatches - warmup, num_microbatches)]  # cool-down
        order[stage] = ops
    return order


SCHEDULES: dict[str, Callable[[int, int], StageOrder]] = {
    "gpipe": gpipe_order,
    "1f1b": one_f_one_b_order,
}


def stage_order(kind: str, num_stages: int, num_microbatches: int) -> StageOrder:
    """Look a schedule up by name; a miss lists the valid names."""
    try:
        generator = SCHEDULES[kind]
    except KeyError:
        raise ValueError(f"unknown schedule {kind!r} (valid: {', '.join(SCHEDULES)})") from None
    return generator(num_stages, num_microbatches)


def build_program(
    order: StageOrder,
    num_microbatches: int,
    stage_to_rank: dict[int, int],
    activation_bytes: float,
    forward_flops: Callable[[int], float],
    backward_flops: Callable[[int], float],
    optimizer_bytes: Callable[[int], float] = lambda stage: 0.0,
) -> Program:
    """Turn per-stage compute orders into per-rank op lists with p2p and an optimizer step.

    Stages on one rank are interleaved in the order given by `order` position (one stage per rank
    today). A forward of stage s > 0 waits on the receive of stage s-1's output; its output is sent
    to stage s+1. A backward of stage s < S-1 waits on the gradient received from stage s+1 and
    sends its input gradient to stage s-1. Consecutive stages on the same rank hand over locally.
    """
    num_stages = len(order)
    ops: dict[int, list[Op]] = {rank: [] for rank in sorted(set(stage_to_rank.values()))}
    for stage in range(num_stages):
        rank = stage_to_rank[stage]
        for phase, mb in order[stage]:
            ops[rank].extend(_compute_with_p2p(phase, mb, stage, num_stages, stage_to_rank, activation_bytes,
                                               forward_flops(stage) if phase == "F" else backward_flops(stage)))
    for stage in range(num_stages):
        ops[stage_to_rank[stage]].append(Compute("OPT", None, stage, nbytes=optimizer_bytes(stage)))
    return Program(ops, num_stages, num_microbatches, dict(stage_to_rank))


def _compute_with_p2p(phase: str, mb: int, stage: int, num_stages: int, stage_to_rank: dict[int, int],
                      nbytes: float, flops: float) -> list[Op]:
    """The receive a compute op waits on, the op itself, and the send of its result."""
    rank = stage_to_rank[stage]
    src = stage - 1 if phase == "F" else stage + 1  # the stage whose output this op consumes
    dst = stage + 1 if phase == "F" else stage - 1  # the stage that consumes this op's output
    ops: list[Op] = []
    deps: tuple[str, ...] = ()
    if 0 <= src < num_stages and stage_to_rank[src] != rank:
        recv = Recv(stage_to_rank[src], (phase, mb, src), nbytes)
        ops.append(recv)
        deps = (recv.label,)
    compute = Compute(phase, mb, stage, flops, deps=deps)
    ops.append(compute)
    if 0 <= dst < num_stages and stage_to_rank[dst] != rank:
        ops.append(Send(stage_to_rank[dst], (phase, mb, stage), nbytes, deps=(compute.label,)))
    return ops
