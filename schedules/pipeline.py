"""Pipeline schedules: the order in which each rank runs its stages' forwards and backwards.

A generator `(num_ranks, num_microbatches, virtual) -> RankOrder` returns
`rank -> [(phase, microbatch, stage), ...]`, the rank's compute order; `build_program` then inserts
the point-to-point sends and receives between neighbouring stages and the optimizer steps, giving
a Program every generator shares. Each registry entry carries its placement: `stage_ranks(p, v)`
places stage c x p + r on rank r (looped); zbv and dualpipev use a V (`v_stage_ranks`: rank r holds
stages r and 2p - 1 - r). Zero-bubble orders also hold W steps (schedules.zero_bubble), PyTorch's
breadth-first and DualPipeV orders are in `looped_bfs_order` and schedules.dualpipe.

With p ranks, m microbatches, equal stage times t_F, t_B and free communication:

GPipe (Huang et al. 2019): every forward, then every backward. A rank holds the activations of
all m microbatches at once.

1F1B, PipeDream-flush (Narayanan et al. 2021): rank r runs min(p - r - 1, m) warm-up forwards,
then alternates one forward and one backward (steady state), then drains the remaining backwards
(cool-down). Same bubble as GPipe, (p - 1) / (m + p - 1), but at most min(p - r, m) microbatches
in flight on rank r.

Interleaved 1F1B (Narayanan et al. 2021, sec 2.2; Megatron-LM's virtual pipeline): the model is
cut into p x v stages and rank r holds the v chunks r, p + r, ..., (v - 1) p + r. Each chunk costs
t_F / v and t_B / v, so the fill and drain shrink to (p - 1)(t_F + t_B) / v while the busy time
stays m (t_F + t_B): bubble = (p - 1) / (v m + p - 1). Megatron's order needs m to be a multiple
of p when v > 1 (see `interleaved_order`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from clustersim.schedules.dualpipe import dualpipev_order, dualpipev_sizes
from clustersim.schedules.ir import Compute, MessageTag, Op, Phase, Program, Recv, Send
from clustersim.schedules.order import (
    B,
    F,
    Generator,
    Placement,
    RankOrder,
    ScheduleError,
    Step,
    split_steps,
    stage_ranks,
    v_stage_ranks,
)
from clustersim.schedules.zero_bubble import (
    interleaved_zb_order,
    interleaved_zb_sizes,
    v_sizes,
    zb_h1_order,
    zb_h1_sizes,
    zbv_order,
)


def one_stage_per_rank(kind: str, num_ranks: int, num_microbatches: int, virtual: int) -> None:
    """The sizes rule of a schedule that runs one stage per rank: virtual = 1."""
    if virtual != 1:
        chunked = ", ".join(name for name, schedule in SCHEDULES.items() if schedule.chunks_per_rank)
        raise ScheduleError(
            "virtual",
            f"schedule {kind!r} runs one stage per rank: virtual must be 1, got {virtual} "
            f"(several chunks per rank: {chunked})",
        )


def gpipe_order(num_ranks: int, num_microbatches: int, virtual: int = 1) -> RankOrder:
    """All forwards in microbatch order, then all backwards in microbatch order."""
    one_stage_per_rank("gpipe", num_ranks, num_microbatches, virtual)
    return {
        rank: [(F, mb, rank) for mb in range(num_microbatches)] + [(B, mb, rank) for mb in range(num_microbatches)]
        for rank in range(num_ranks)
    }


def one_f_one_b_order(num_ranks: int, num_microbatches: int, virtual: int = 1) -> RankOrder:
    """PipeDream-flush: warm-up forwards, steady one-forward-one-backward, cool-down backwards."""
    one_stage_per_rank("1f1b", num_ranks, num_microbatches, virtual)
    order: RankOrder = {}
    for rank in range(num_ranks):
        warmup = min(num_ranks - rank - 1, num_microbatches)
        ops = [(F, mb, rank) for mb in range(warmup)]  # warm-up
        for i in range(num_microbatches - warmup):  # steady 1F1B
            ops += [(F, warmup + i, rank), (B, i, rank)]
        ops += [(B, mb, rank) for mb in range(num_microbatches - warmup, num_microbatches)]  # cool-down
        order[rank] = ops
    return order


def interleaved_sizes(kind: str, num_ranks: int, num_microbatches: int, virtual: int) -> None:
    """Megatron's interleaved order needs virtual >= 1 and, when virtual > 1, microbatches in
    whole groups of pp."""
    p, m, v = num_ranks, num_microbatches, virtual
    if v < 1:
        raise ScheduleError("virtual", f"{kind} schedule needs virtual >= 1, got {v}")
    if v > 1 and m % p:
        raise ScheduleError("microbatches", f"{kind} schedule needs microbatches ({m}) to be a multiple of pp ({p})")


def interleaved_order(num_ranks: int, num_microbatches: int, virtual: int = 1) -> RankOrder:
    """Megatron-LM's interleaved 1F1B (`forward_backward_pipelining_with_interleaving`).

    Each rank runs v x m forwards and v x m backwards. Forwards go in microbatch groups of p: the
    k-th forward is chunk c = (k // p) % v of microbatch (k // (p v)) p + k % p, so a rank runs
    chunk 0 of microbatches 0..p-1, then chunk 1 of the same p, ..., then the next group. The k-th
    backward takes the same microbatch with the chunks reversed, v - 1 - c. Rank r warms up with
    min(2 (p - r - 1) + (v - 1) p, v m) forwards, then alternates forward and backward, then
    drains. Chunk c of rank r is stage c x p + r (`stage_ranks`). With v = 1 the warm-up is still
    2 (p - r - 1), Megatron's formula, not 1F1B's p - r - 1 (same bubble, more in flight); older
    Megatron versions also ran every forward first when m == p, current ones only cap at v m.
    """
    interleaved_sizes("interleaved", num_ranks, num_microbatches, virtual)
    p, m, v = num_ranks, num_microbatches, virtual
    total = v * m

    def forward(rank: int, k: int) -> Step:
        chunk, mb = (k // p) % v, (k // (p * v)) * p + k % p
        return (F, mb, chunk * p + rank)

    def backward(rank: int, k: int) -> Step:
        chunk, mb = v - 1 - (k // p) % v, (k // (p * v)) * p + k % p
        return (B, mb, chunk * p + rank)

    order: RankOrder = {}
    for rank in range(p):
        warmup = min(2 * (p - rank - 1) + (v - 1) * p, total)
        ops = [forward(rank, k) for k in range(warmup)]  # warm-up
        for k in range(total - warmup):  # steady 1F1B
            ops += [forward(rank, warmup + k), backward(rank, k)]
        ops += [backward(rank, k) for k in range(total - warmup, total)]  # cool-down
        order[rank] = ops
    return order


def looped_bfs_order(num_ranks: int, num_microbatches: int, virtual: int = 1) -> RankOrder:
    """Breadth-first pipeline (Lamy-Poirier 2022, arXiv:2211.05953), as PyTorch's ScheduleLoopedBFS
    orders it: each rank runs every microbatch's forward through its first chunk, then its second,
    ...; then the backwards, last chunk first, each chunk's microbatches in reverse (the last
    forward's activations are the first freed). Chunk c of rank r is stage c x p + r."""
    looped_bfs_sizes("looped-bfs", num_ranks, num_microbatches, virtual)
    m = num_microbatches
    order: RankOrder = {}
    for rank in range(num_ranks):
        stages = [chunk * num_ranks + rank for chunk in range(virtual)]
        order[rank] = [(F, mb, s) for s in stages for mb in range(m)] + [
            (B, mb, s) for s in reversed(stages) for mb in reversed(range(m))
        ]
    return order


def looped_bfs_sizes(kind: str, num_ranks: int, num_microbatches: int, virtual: int) -> None:
    """Any number of chunks per rank and of microbatches."""
    if virtual < 1:
        raise ScheduleError("virtual", f"{kind} schedule needs virtual >= 1, got {virtual}")


SizesRule = Callable[[str, int, int, int], None]  # (name, num_ranks, num_microbatches, virtual) -> raises


@dataclass(frozen=True)
class Schedule:
    """A registry entry: the order generator and the sizes it can schedule, so callers (the
    scenario check, the CLI, a reduced test run) ask the entry instead of branching on its name.
    Adding a schedule: write its generator (and its sizes rule, if a new one) here, and one line
    in SCHEDULES."""

    order: Generator
    sizes: SizesRule  # raises ScheduleError naming the knob at fault
    chunks_per_rank: bool = False  # whether it runs several model chunks per rank (virtual > 1)
    placement: Placement = stage_ranks  # stage -> rank for (num_ranks, virtual): looped or V
    splits_backward: bool = False  # whether its order splits backwards into B and W

    def check(self, name: str, num_ranks: int, num_microbatches: int, virtual: int) -> None:
        """Raise ScheduleError (naming the knob at fault) unless the schedule can run these sizes."""
        self.sizes(name, num_ranks, num_microbatches, virtual)

    def fewest_microbatches(self, name: str, num_ranks: int, virtual: int) -> int:
        """The fewest microbatches the schedule runs with these sizes (a reduced run's batch)."""
        for m in range(1, 2 * num_ranks + 1):  # dualpipev needs 2 pp
            try:
                self.check(name, num_ranks, m, virtual)
            except ScheduleError as exc:
                if exc.knob != "microbatches":
                    raise
                continue
            return m
        raise ScheduleError("microbatches", f"schedule {name!r} runs no microbatch count up to 2 pp ({2 * num_ranks})")


SCHEDULES: dict[str, Schedule] = {
    "gpipe": Schedule(gpipe_order, one_stage_per_rank),
    "1f1b": Schedule(one_f_one_b_order, one_stage_per_rank),
    "interleaved": Schedule(interleaved_order, interleaved_sizes, chunks_per_rank=True),
    "zb-h1": Schedule(zb_h1_order, zb_h1_sizes, splits_backward=True),
    "interleaved-zb": Schedule(interleaved_zb_order, interleaved_zb_sizes, chunks_per_rank=True, splits_backward=True),
    "zbv": Schedule(zbv_order, v_sizes, chunks_per_rank=True, placement=v_stage_ranks, splits_backward=True),
    "dualpipev": Schedule(
        dualpipev_order, dualpipev_sizes, chunks_per_rank=True, placement=v_stage_ranks, splits_backward=True
    ),
    "looped-bfs": Schedule(looped_bfs_order, looped_bfs_sizes, chunks_per_rank=True),
}


def schedule(kind: str) -> Schedule:
    """The registry entry of `kind`; a miss lists the valid names."""
    try:
        return SCHEDULES[kind]
    except KeyError:
        raise ValueError(f"unknown schedule {kind!r} (valid: {', '.join(SCHEDULES)})") from None


def rank_order(kind: str, num_ranks: int, num_microbatches: int, virtual: int = 1) -> RankOrder:
    """Look a schedule up by name and run it; raises ScheduleError (a ValueError naming the knob)
    for sizes it cannot schedule (virtual > 1 on gpipe, m not a multiple of p, ...)."""
    entry = schedule(kind)
    entry.check(kind, num_ranks, num_microbatches, virtual)
    return entry.order(num_ranks, num_microbatches, virtual)


def placement(kind: str, num_ranks: int, virtual: int = 1) -> dict[int, int]:
    """Stage -> rank of schedule `kind` (looped, or a V for zbv and dualpipev)."""
    return schedule(kind).placement(num_ranks, virtual)


def build_program(
    order: RankOrder,
    num_microbatches: int,
    stage_to_rank: dict[int, int],
    activation_bytes: float,
    forward_flops: Callable[[int], float],
    backward_flops: Callable[[int], float],
    optimizer_bytes: Callable[[int], float] = lambda stage: 0.0,
    weight_flops: Callable[[int], float] | None = None,
    blocking_p2p: bool = False,
) -> Program:
    """Turn per-rank compute orders into per-rank op lists with p2p and optimizer steps.

    A forward of stage s > 0 waits on the receive of stage s-1's output; its output is sent to
    stage s+1. A backward of stage s < S-1 waits on the gradient received from stage s+1 and sends
    its input gradient to stage s-1. Consecutive stages on the same rank (interleaved with p = 1,
    the turn of a V: stages p-1 and p on rank p-1) hand over locally: the earlier op on the compute
    stream is the dependency. A W sends and receives nothing. Each rank ends with one optimizer step
    per stage it holds, in stage order. `blocking_p2p`: compute ops and optimizer steps also wait for
    their rank's earlier sends (Megatron-LM's _communicate, 2021-22: batch_isend_irecv, wait, sync).

    Costs: F takes forward_flops(s); a whole backward backward_flops(s); where the order splits it,
    W takes weight_flops(s) and B the rest, backward_flops(s) - weight_flops(s) (an order with W
    steps needs `weight_flops`).
    """
    num_stages = len(stage_to_rank)
    split = split_steps(order)
    if split and weight_flops is None:
        raise ValueError("this order splits backwards into B and W: build_program needs weight_flops")
    ops: dict[int, list[Op]] = {rank: [] for rank in sorted(set(stage_to_rank.values()) | set(order))}
    sent: dict[int, tuple[str, ...]] = {rank: () for rank in ops}  # sends a blocking rank's next compute waits for
    for rank in sorted(order):
        for phase, mb, stage in order[rank]:
            after = sent[rank]
            if phase == Phase.W:
                assert weight_flops is not None
                ops[rank].append(Compute(phase, mb, stage, weight_flops(stage), deps=after))
                continue
            flops = forward_flops(stage) if phase == Phase.F else backward_flops(stage)
            if phase == Phase.B and (mb, stage) in split:
                assert weight_flops is not None
                flops -= weight_flops(stage)
            step = _compute_with_p2p(rank, phase, mb, stage, num_stages, stage_to_rank, activation_bytes, flops, after)
            ops[rank].extend(step)
            sent[rank] = tuple(op.label for op in step if isinstance(op, Send) and blocking_p2p)
    for stage, rank in sorted(stage_to_rank.items()):
        ops[rank].append(Compute(Phase.OPT, None, stage, nbytes=optimizer_bytes(stage), deps=sent[rank]))
    return Program(ops, num_stages, num_microbatches, dict(stage_to_rank))


def _compute_with_p2p(
    rank: int,
    phase: Phase,
    mb: int,
    stage: int,
    num_stages: int,
    stage_to_rank: dict[int, int],
    nbytes: float,
    flops: float,
    after: tuple[str, ...] = (),
) -> list[Op]:
    """The receive a compute op on `rank` waits on, the op itself (and on `after`), its result's send."""
    src = stage - 1 if phase == Phase.F else stage + 1  # the stage whose output this op consumes
    dst = stage + 1 if phase == Phase.F else stage - 1  # the stage that consumes this op's output
    ops: list[Op] = []
    deps = after
    if 0 <= src < num_stages and stage_to_rank[src] != rank:
        recv = Recv(stage_to_rank[src], MessageTag(phase, mb, src), nbytes)
        ops.append(recv)
        deps = (recv.label, *after)
    compute = Compute(phase, mb, stage, flops, deps=deps)
    ops.append(compute)
    if 0 <= dst < num_stages and stage_to_rank[dst] != rank:
        ops.append(Send(stage_to_rank[dst], MessageTag(phase, mb, stage), nbytes, deps=(compute.label,)))
    return ops
