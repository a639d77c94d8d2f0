"""DualPipeV (DeepSeek-AI 2024, DeepSeek-V3 technical report sec 3.2.1, and its "cut-in-half"
variant in github.com/deepseek-ai/DualPipe), as PyTorch's ScheduleDualPipeV builds it.

Two chunks per rank in a V (schedules.order.v_stage_ranks). In the steady state a rank overlaps
the forward of one chunk with the full backward of the other (PyTorch's OVERLAP_F_B action, which
its runtime performs as the forward, then the backward, one after the other: this simulator runs
them in that order on the compute stream). Warm-up and cool-down split some backwards into B and a
W that runs later, from a queue, oldest first. DualPipe's README gives, with PP = 2p stages on p
ranks, a bubble of (PP/2 - 1)(F&B + B - 3W) and PP + 1 chunk-microbatches of activations per rank.
It needs at least PP microbatches.
"""

from __future__ import annotations

from collections import defaultdict, deque

from clustersim.schedules.order import B, F, RankOrder, ScheduleError, Step, W


def dualpipev_sizes(kind: str, num_ranks: int, num_microbatches: int, virtual: int) -> None:
    """Two chunks per rank, and at least as many microbatches as stages (2 pp)."""
    if virtual != 2:
        raise ScheduleError(
            "virtual", f"schedule {kind!r} runs two chunks per rank in a V: virtual must be 2, got {virtual}"
        )
    if num_microbatches < 2 * num_ranks:
        raise ScheduleError(
            "microbatches",
            f"{kind} schedule needs at least as many microbatches ({num_microbatches}) as stages "
            f"(2 x pp = {2 * num_ranks})",
        )


def dualpipev_order(num_ranks: int, num_microbatches: int, virtual: int = 2) -> RankOrder:
    """Each rank's order in PyTorch's eight steps (ScheduleDualPipeV._calculate_single_rank_operations)."""
    dualpipev_sizes("dualpipev", num_ranks, num_microbatches, virtual)
    p, m = num_ranks, num_microbatches
    return {rank: _rank_order(p, m, rank) for rank in range(p)}


def _rank_order(p: int, m: int, rank: int) -> list[Step]:
    down, up = rank, 2 * p - 1 - rank  # the rank's chunk on the way down and on the way up
    forwards: dict[int, int] = defaultdict(int)  # stage -> next forward's microbatch
    backwards: dict[int, int] = defaultdict(int)  # stage -> next backward's microbatch
    pending: deque[tuple[int, int]] = deque()  # (microbatch, stage) of B's whose W has not run
    ops: list[Step] = []

    def forward(stage: int) -> None:
        ops.append((F, forwards[stage], stage))
        forwards[stage] += 1

    def backward(stage: int, split: bool) -> None:
        """A full backward, or (split) its input gradient with the W queued."""
        ops.append((B, backwards[stage], stage))
        if split:
            pending.append((backwards[stage], stage))
        backwards[stage] += 1

    def weight() -> None:
        if pending:
            mb, stage = pending.popleft()
            ops.append((W, mb, stage))

    for _ in range(2 * (p - rank - 1)):  # 1: forwards of the first chunk
        forward(down)
    for _ in range(rank + 1):  # 2: both chunks
        forward(down)
        forward(up)
    for _ in range(p - rank - 1):  # 3: zero bubble on the second chunk
        backward(up, split=True)
        weight()
        forward(up)
    for _ in range(m - 2 * p + rank + 1):  # 4: overlapped pairs, each a forward then a full backward
        forward(down)  # rank p - 1's first pair is not overlapped, but runs in the same order
        backward(up, split=False)
        forward(up)
        backward(down, split=False)
    for _ in range(p - rank - 1):  # 5
        backward(up, split=False)
        forward(up)
        backward(down, split=False)
    split = False
    for i in range(rank + 1):  # 6: the second half of these backwards split
        if i == (rank + 1) // 2 and rank % 2 == 1:
            split = True
        backward(up, split)
        if i == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        backward(down, split)
    for _ in range(p - rank - 1):  # 7
        weight()
        backward(down, split)
    for _ in range(rank + 1):  # 8: the W's left
        weight()
    return ops
