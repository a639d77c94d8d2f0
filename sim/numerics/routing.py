"""An MoE layer's router in numpy: which experts each token goes to, with what weight, and which
assignments fit in the experts' buffers (the layer around it is sim/numerics/moe.py).

Routing is per group of T tokens x (T, h): one (rank, microbatch), flattened in (b, s) order.

    P    = softmax(x W_gate)                                   # (T, E), W_gate has no bias
    c_t  = the top_k experts of token t by P, most probable first; ties -> lower expert index
    w_ti = P[t, c_ti]    (Switch, top-1)   or, normalize=True:   P[t, c_ti] / sum_j P[t, c_tj]

A selection bias b (DeepSeek-V3's auxiliary-loss-free balancing bias, arXiv:2412.19437 sec. 2.1.2)
shifts which experts are chosen, top_k of P[t] + b, but not their weights, which stay P[t, c_ti]; a
large b_e makes expert e the hot expert of a skewed router.

Node-limited routing (DeepSeek-V3 sec. 2.1.2; deepseek-ai/DeepSeek-V3 inference/model.py, Gate.forward):
the E experts form G equal blocks (one per node); each token scores every block by its best
expert's score (with a selection bias: the sum of its best two, as DeepSeek-V3's gate does), keeps
its M best blocks (ties -> lower block) and picks its top_k among their experts only, so its rows
go to at most M nodes.

Capacity: C = ceil(capacity_factor T top_k / E) rows per expert per group (capacity_factor None:
no limit). Assignments are admitted in priority order: every token's first choice in token order,
then every second choice, ...; one that reaches a full expert is dropped and adds nothing (the
token keeps its residual outside this layer).

Uniform router (W_gate = 0): every probability is 1/E, so the index tie-break sends every token to
experts 0..top_k-1, the worst possible balance; with a capacity, all past C on those experts drop.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


def check_routing(
    num_experts: int,
    top_k: int,
    capacity_factor: float | None,
    expert_groups: int = 1,
    limited_groups: int | None = None,
) -> None:
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k ({top_k}) must be in 1..num_experts ({num_experts})")
    if capacity_factor is not None and not capacity_factor > 0:
        raise ValueError(f"capacity_factor ({capacity_factor}) must be > 0, or None for no dropping")
    if num_experts % expert_groups or not 1 <= (limited_groups or 1) <= expert_groups:
        raise ValueError(f"{expert_groups} expert groups, {limited_groups} per token, for {num_experts} experts")
    if limited_groups is not None and top_k > limited_groups * (num_experts // expert_groups):
        raise ValueError(f"top_k ({top_k}) > the experts of {limited_groups} of {expert_groups} blocks")


class Routing(NamedTuple):
    """One group's routing. An assignment is (token t, choice j), flat index t top_k + j."""

    probs: np.ndarray  # (T, E) router softmax
    experts: np.ndarray  # (T, k) chosen experts, most probable first
    weights: np.ndarray  # (T, k) gate weights
    admitted: np.ndarray  # (T, k) bool: within its expert's capacity
    slots: np.ndarray  # (A,) admitted assignments in (expert, priority) order: the dispatch order
    tokens_per_expert: np.ndarray  # (E,) admitted assignments per expert
    capacity: int | None  # C, or None for no limit
    dropped: int  # assignments over capacity

    @property
    def slot_tokens(self) -> np.ndarray:
        return self.slots // self.experts.shape[1]  # (A,)

    @property
    def slot_weights(self) -> np.ndarray:
        return self.weights.reshape(-1)[self.slots]  # (A,)


def route(
    x2d: np.ndarray,
    w_gate: np.ndarray,
    top_k: int,
    capacity_factor: float | None,
    normalize: bool,
    selection_bias: tuple[float, ...] | None = None,
    expert_groups: int = 1,
    limited_groups: int | None = None,
) -> Routing:
    """Top-k over softmax(x W_gate) (+ the selection bias), within each token's `limited_groups`
    best expert blocks when set, then admission in priority order up to the capacity."""
    tokens, num_experts = x2d.shape[0], w_gate.shape[1]
    check_routing(num_experts, top_k, capacity_factor, expert_groups, limited_groups)
    logits = x2d @ w_gate  # (T, E)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)  # (T, E)
    scores = probs if selection_bias is None else probs + np.asarray(selection_bias)  # (T, E)
    if limited_groups is not None and limited_groups < expert_groups:
        scores = _within_best_groups(scores, expert_groups, limited_groups, best_of=1 if selection_bias is None else 2)
    experts = np.argsort(-scores, axis=1, kind="stable")[:, :top_k]  # (T, k); stable: ties -> lower index
    chosen = np.take_along_axis(probs, experts, axis=1)  # (T, k)
    weights = chosen / chosen.sum(axis=1, keepdims=True) if normalize else chosen
    by_priority = experts.T.reshape(-1)  # (k T,): priority q = j T + t
    queue = np.argsort(by_priority, kind="stable")  # priorities in (expert, priority) order
    wanted = np.bincount(by_priority, minlength=num_experts)  # (E,)
    place = np.arange(queue.size) - np.repeat(np.cumsum(wanted) - wanted, wanted)  # place in its expert's queue
    capacity = None if capacity_factor is None else math.ceil(capacity_factor * tokens * top_k / num_experts)
    kept = queue if capacity is None else queue[place < capacity]  # (A,) priorities
    slots = (kept % tokens) * top_k + kept // tokens  # priority q = j T + t -> assignment t k + j
    admitted = np.zeros(tokens * top_k, dtype=bool)
    admitted[slots] = True
    tokens_per_expert = wanted if capacity is None else np.minimum(wanted, capacity)
    return Routing(
        probs,
        experts,
        weights,
        admitted.reshape(tokens, top_k),
        slots,
        tokens_per_expert,
        capacity,
        tokens * top_k - slots.size,
    )


def _within_best_groups(scores: np.ndarray, groups: int, keep: int, best_of: int) -> np.ndarray:
    """`scores` (T, E) with the experts outside each token's `keep` best of `groups` equal blocks
    set to -inf; a block scores the sum of its `best_of` highest scores."""
    tokens = scores.shape[0]
    blocks = scores.reshape(tokens, groups, -1)  # (T, G, E/G)
    block_scores = -np.sort(-blocks, axis=2)[:, :, :best_of].sum(axis=2)  # (T, G)
    kept = np.argsort(-block_scores, axis=1, kind="stable")[:, :keep]  # (T, M); ties -> lower block
    mask = np.ones((tokens, groups), dtype=bool)
    np.put_along_axis(mask, kept, False, axis=1)
    return np.where(np.repeat(mask, blocks.shape[2], axis=1), -np.inf, scores)


def routing_summary(routings: list[Routing], num_experts: int) -> dict:
    """What a run's routing did over all its MoE layers and groups: admitted rows per expert, the
    share of assignments dropped over capacity, and the hottest expert's share of the rows."""
    admitted = (
        np.sum([r.tokens_per_expert for r in routings], axis=0, dtype=np.int64)
        if routings
        else np.zeros(num_experts, np.int64)
    )
    assigned = sum(r.experts.size for r in routings)
    return {
        "tokens_per_expert": admitted.tolist(),
        "dropped_token_rate": sum(r.dropped for r in routings) / assigned if assigned else 0.0,
        "hottest_expert": int(np.argmax(admitted)),
        "hottest_expert_share": float(admitted.max() / admitted.sum()) if admitted.sum() else 0.0,
    }
