"""Where a stage op is cut into pieces (the op IR's `Compute.part`): at its tensor-parallel
collectives (Megatron's f and g, schedules.tensor_parallel), at its MoE layers' expert-parallel
all-to-alls, and where its ZeRO-3 units start (schedules.zero3). `tp_stage_plan` lists the pieces
of one forward or backward as work items, each piece with the collective that ends it.
"""

from __future__ import annotations

from clustersim.schedules.ir import Phase
from clustersim.schedules.tp_overlap import overlapped_sublayer
from clustersim.schedules.zero3 import unit_ranges

Piece = tuple[tuple[str, ...], str | None, str | None]  # (work items, the collective ending it, its group)
UNIT_ITEM = "unit"  # no work: marks the piece a ZeRO-3 unit starts in (schedules.zero3)


def tp_stage_plan(
    phase: Phase,
    layers: int | list[bool],
    first: bool,
    last: bool,
    sequence_parallel: bool,
    recompute_full: bool = False,
    *,
    tp: int,
    ep: int = 1,
    unit_layers: int | None = None,
    overlap: bool = False,
) -> list[Piece]:
    """The pieces of one stage op, in order, cut at its tensor-parallel collectives (tp > 1) and
    its MoE layers' expert-parallel all-to-alls (ep > 1). `layers`: how many (dense) layers, or
    for each layer whether its MLP is a mixture of experts.

    Work items: "F.embed", "F.attn", "F.mlp", "F.head" (forward of the vocab-parallel embedding, a
    layer's attention or MLP, the LM head with its share of the cross-entropy), for an MoE MLP
    "F.router" and "F.experts", and the same with "B." for their backward; layernorms, residuals
    and the loss are too small to count and belong to no item. With tensor parallelism, forward,
    no sequence parallelism: [embed -> all-reduce] + per layer [attention -> all-reduce, MLP ->
    all-reduce] + [head -> all-gather of each rank's (log-sum-exp, target logit)] + the rest.
    Backward: [head -> all-reduce of its input gradient] + per layer [MLP -> all-reduce, attention
    -> all-reduce] + [embedding]. Sequence parallelism: forward [embed -> reduce-scatter] + per
    layer [all-gather, attention -> reduce-scatter, all-gather, MLP -> reduce-scatter] +
    [all-gather, head -> all-gather]; backward [head -> reduce-scatter] + per layer [all-gather,
    MLP -> reduce-scatter, all-gather, attention -> reduce-scatter] + [all-gather, embedding]. An
    MoE MLP is router -> all-to-all (counts, group "ep_counts") -> all-to-all (dispatch) -> experts
    -> all-to-all (combine) in the forward and all-to-all -> experts -> all-to-all -> router in the
    backward (groups "ep"), inside the same tensor-parallel collectives. Full recompute runs the
    forward's pieces again first (its last piece merging into the backward's first).

    `unit_layers` (ZeRO 3, schedules.zero3): the layers come in units of that many (the embedding
    with the first, the head with the last); a backward runs its units last to first, each one's
    recomputed forward (full recompute) just before its backward, as per-layer checkpointing does.
    A unit starts a new piece, marked by the item UNIT_ITEM, cut without a collective where none
    falls (tp = 1); None: one unit, the stage. With `overlap` no collective falls between two units
    (the last sublayer's post segment precedes the next one's pre): the unit starts inside a piece.

    `overlap` (sequence parallelism, tp > 1): each attention and dense MLP cut at its overlapped
    GEMMs, its all-gather and reduce-scatter beside them (schedules.tp_overlap).
    """
    moe = [False] * layers if isinstance(layers, int) else list(layers)
    units = [[moe[i] for i in layers] for layers in unit_ranges(range(len(moe)), unit_layers)]
    n = len(units)

    def unit_tokens(k: int, forward: bool) -> list:
        """Unit k's tokens: the embedding goes with the first unit, the head with the last."""
        make = _forward_tokens if forward else _backward_tokens
        return make(units[k], first and k == 0, last and k == n - 1, sequence_parallel, tp, ep, overlap)

    if phase == Phase.F:
        bodies = [unit_tokens(k, True) for k in range(n)]
    elif phase == Phase.B:
        bodies = [(unit_tokens(k, True) if recompute_full else []) + unit_tokens(k, False) for k in reversed(range(n))]
    else:
        raise ValueError(f"stage pieces belong to F or B ops, not {phase!r}")
    pieces: list[Piece] = []
    items: list[str] = []
    for j, body in enumerate(bodies):
        if j and items and tp == 1:  # a unit boundary where no collective cuts the op already
            pieces.append((tuple(items), None, None))
            items = []
        items += [UNIT_ITEM] if j else []
        for token in body:
            if isinstance(token, str):
                items.append(token)
            else:
                pieces.append((tuple(items), *token))
                items = []
    return pieces + [(tuple(items), None, None)]


def unit_starts(pieces: list[Piece]) -> tuple[int, ...]:
    """The index of the piece each unit of `tp_stage_plan(..., unit_layers=...)` starts in, in
    the op's order (a backward runs its units last to first)."""
    return (0,) + tuple(i for i, (items, _, _) in enumerate(pieces) if UNIT_ITEM in items)


def _around(body: list, sp: bool, tp: int, overlap: bool) -> list:
    """A sublayer entered through f and left through g (Megatron), for tp > 1; `overlap`: a
    dense sublayer's all-gather and reduce-scatter beside its GEMMs (schedules.tp_overlap)."""
    if tp == 1:
        return body
    if overlap and sp and len(body) == 1:
        return overlapped_sublayer(body[0], tp)
    return ([("all_gather", "tp")] if sp else []) + body + [("reduce_scatter" if sp else "all_reduce", "tp")]


def _mlp(phase: Phase, moe: bool, ep: int) -> list:
    """A dense MLP, or an MoE one: the forward routes, tells every rank how many rows per expert
    are coming (a small all-to-all of counts), dispatches, runs the local experts and combines; the
    backward sends the output gradients back along the same routes (counts known) and returns."""
    if not moe:
        return [f"{phase}.mlp"]
    exchange = [("all_to_all", "ep")] if ep > 1 else []
    if phase == Phase.F:
        counts = [("all_to_all", "ep_counts")] if ep > 1 else []
        return [f"{phase}.router", *counts, *exchange, f"{phase}.experts", *exchange]
    return [*exchange, f"{phase}.experts", *exchange, f"{phase}.router"]


def _forward_tokens(moe: list[bool], first: bool, last: bool, sp: bool, tp: int, ep: int, overlap: bool) -> list:
    tokens: list = []
    if first:
        tokens += ["F.embed"] + ([("reduce_scatter" if sp else "all_reduce", "tp")] if tp > 1 else [])
    for is_moe in moe:
        tokens += _around(["F.attn"], sp, tp, overlap) + _around(_mlp(Phase.F, is_moe, ep), sp, tp, overlap)
    if last:
        tokens += ([("all_gather", "tp")] if sp and tp > 1 else []) + ["F.head"]
        tokens += [("all_gather", "tp")] if tp > 1 else []
    return tokens


def _backward_tokens(moe: list[bool], first: bool, last: bool, sp: bool, tp: int, ep: int, overlap: bool) -> list:
    tokens: list = []
    if last:
        tokens += ["B.head"] + ([("reduce_scatter" if sp else "all_reduce", "tp")] if tp > 1 else [])
    for is_moe in reversed(moe):
        tokens += _around(_mlp(Phase.B, is_moe, ep), sp, tp, overlap) + _around(["B.attn"], sp, tp, overlap)
    if first:
        tokens += ([("all_gather", "tp")] if sp and tp > 1 else []) + ["B.embed"]
    return tokens
