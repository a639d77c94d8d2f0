"""A Mixture-of-Experts FFN in numpy with hand-written backward: the single-device reference and
the expert-parallel shard that moves tokens by all_to_all.

Routing is per group of T tokens x (T, h): one (rank, microbatch), flattened in (b, s) order.

    P    = softmax(x W_gate)                                   # (T, E), W_gate has no bias
    c_t  = the top_k experts of token t by P, most probable first; ties -> lower expert index
    w_ti = P[t, c_ti]    (Switch, top-1)   or, normalize=True:   P[t, c_ti] / sum_j P[t, c_tj]
    y_t  = sum over admitted i of w_ti MLP_{c_ti}(x_t)  +  MLP_shared(x_t)   (shared=True only)

A selection bias b (DeepSeek-V3's auxiliary-loss-free balancing bias, arXiv:2412.19437 sec. 2.1.2)
shifts which experts are chosen, top_k of P[t] + b, but not their weights, which stay P[t, c_ti]; a
large b_e makes expert e the hot expert of a skewed router.

Capacity: C = ceil(capacity_factor T top_k / E) rows per expert per group (capacity_factor None:
no limit). Assignments are admitted in priority order: every token's first choice in token order,
then every second choice, ...; one that reaches a full expert is dropped and adds nothing (the
token keeps its residual outside this layer). The backward treats the top-k choice and the
dropping as constants, as MoE implementations do; gradients reach x through the experts and
through the gate weights, the softmax and W_gate.

Uniform router (W_gate = 0): every probability is 1/E, so the index tie-break sends every token to
experts 0..top_k-1, the worst possible balance; with a capacity, all past C on those experts drop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from clustersim.sim.collectives.ops import Pieces
from clustersim.sim.numerics.layers import INIT_STD, mlp_backward, mlp_forward

MLP_PARAMS = ("fc.w", "fc.b", "proj.w", "proj.b")


@dataclass(frozen=True)
class MoEConfig:
    """The layer's knobs; `normalize` renormalizes the chosen probabilities (GShard, Mixtral);
    `selection_bias` (one per expert) shifts the top-k choice only; `group_tokens`: the tokens of
    one routing group (GShard's group size; capacity applies per group), None: a call's tokens."""

    num_experts: int
    top_k: int = 1
    capacity_factor: float | None = None
    normalize: bool = False
    shared: bool = False
    selection_bias: tuple[float, ...] | None = None
    group_tokens: int | None = None

    def __post_init__(self) -> None:
        check_routing(self.num_experts, self.top_k, self.capacity_factor)
        if self.selection_bias is not None and len(self.selection_bias) != self.num_experts:
            raise ValueError(f"selection_bias has {len(self.selection_bias)} entries for {self.num_experts} experts")
        if self.group_tokens is not None and self.group_tokens < 1:
            raise ValueError(f"group_tokens ({self.group_tokens}) must be >= 1")

    def nominal_rows(self, tokens: int) -> int:
        """Rows a group of `tokens` sends to the experts when balanced, what the cost model times:
        T k, or with a capacity every expert's full buffer, E C (sim.cost.moe_routed_rows)."""
        if self.capacity_factor is None:
            return tokens * self.top_k
        return self.num_experts * math.ceil(self.capacity_factor * tokens * self.top_k / self.num_experts)


def check_routing(num_experts: int, top_k: int, capacity_factor: float | None) -> None:
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k ({top_k}) must be in 1..num_experts ({num_experts})")
    if capacity_factor is not None and not capacity_factor > 0:
        raise ValueError(f"capacity_factor ({capacity_factor}) must be > 0, or None for no dropping")


def experts_of_rank(rank: int, num_experts: int, ep: int) -> range:
    """Expert e lives on EP rank e // (E / ep): contiguous blocks, so rank order is expert order."""
    if ep < 1 or num_experts % ep:
        raise ValueError(f"ep ({ep}) must divide num_experts ({num_experts})")
    if not 0 <= rank < ep:
        raise ValueError(f"EP rank {rank} is outside 0..{ep - 1}")
    per_rank = num_experts // ep
    return range(rank * per_rank, (rank + 1) * per_rank)


def moe_param_shapes(name: str, hidden: int, ffn: int, num_experts: int, shared: bool) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape, in init order: gate, experts 0..E-1, then the shared expert."""
    mlp = {"fc.w": (hidden, ffn), "fc.b": (ffn,), "proj.w": (ffn, hidden), "proj.b": (hidden,)}
    shapes = {f"{name}.gate.w": (hidden, num_experts)}
    for owner in [f"expert{e}" for e in range(num_experts)] + (["shared"] if shared else []):
        shapes.update({f"{name}.{owner}.{suffix}": shape for suffix, shape in mlp.items()})
    return shapes


def init_moe_params(
    name: str, hidden: int, ffn: int, num_experts: int, shared: bool, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """GPT-2 init drawn in `moe_param_shapes` order: weights ~ N(0, INIT_STD^2), biases 0."""
    return {
        n: np.zeros(shape) if n.endswith(".b") else rng.standard_normal(shape) * INIT_STD
        for n, shape in moe_param_shapes(name, hidden, ffn, num_experts, shared).items()
    }


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
) -> Routing:
    """Top-k over softmax(x W_gate) (+ the selection bias), then admission in priority order up
    to the capacity."""
    tokens, num_experts = x2d.shape[0], w_gate.shape[1]
    check_routing(num_experts, top_k, capacity_factor)
    logits = x2d @ w_gate  # (T, E)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)  # (T, E)
    scores = probs if selection_bias is None else probs + np.asarray(selection_bias)  # (T, E)
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


def _route_group(p, name, x2d, cfg: MoEConfig) -> Routing:
    w_gate = p[f"{name}.gate.w"]
    if w_gate.shape[1] != cfg.num_experts:
        raise ValueError(f"{name}.gate.w has {w_gate.shape[1]} experts, the config {cfg.num_experts}")
    return route(x2d, w_gate, cfg.top_k, cfg.capacity_factor, cfg.normalize, cfg.selection_bias)


# ---- the pieces both the reference and the EP shard run -------------------------------------------


def experts_forward(p, name, experts, rows, counts):
    """rows (R, h) grouped by expert: the first counts[0] rows go through experts[0]'s MLP, ..."""
    outs, caches = [], []
    for e, chunk in zip(experts, np.split(rows, np.cumsum(counts)[:-1])):
        out, cache = mlp_forward(p, f"{name}.expert{e}", chunk)  # (n_e, h)
        outs.append(out)
        caches.append(cache)
    return np.concatenate(outs), (counts, caches)


def experts_backward(drows, cache):
    counts, caches = cache
    dxs, grads = [], {}
    for chunk, c in zip(np.split(drows, np.cumsum(counts)[:-1]), caches):
        dx, g = mlp_backward(chunk, c)  # (n_e, h)
        dxs.append(dx)
        grads |= g
    return np.concatenate(dxs), grads


def _combine(p, name, x2d, routing: Routing, out, cfg: MoEConfig):
    """At the tokens' source: y_t = sum of w * (expert output rows, slot order) + shared(x_t)."""
    y = np.zeros_like(x2d)  # (T, h)
    np.add.at(y, routing.slot_tokens, routing.slot_weights[:, None] * out)
    c_shared = None
    if cfg.shared:
        s, c_shared = mlp_forward(p, f"{name}.shared", x2d)  # (T, h)
        y += s
    return y, (name, x2d, p[f"{name}.gate.w"], routing, out, cfg, c_shared)


def _combine_backward(dy, cache):
    """dL/d(expert output rows) = w dy_t, and dx, grads of the gate path (and the shared expert).

    dw = <dy_t, out> for admitted rows, 0 for dropped ones; normalize (w_i = P_i / S):
    dP_i = (dw_i - sum_j dw_j w_j) / S; softmax: dz = P (dP - sum P dP); dx = dz W^T, dW = x^T dz.
    """
    name, x2d, w_gate, routing, out, cfg, c_shared = cache
    tokens, k = routing.experts.shape
    drows = routing.slot_weights[:, None] * dy[routing.slot_tokens]  # (A, h)
    dweights = np.zeros(tokens * k, dtype=dy.dtype)
    dweights[routing.slots] = (dy[routing.slot_tokens] * out).sum(axis=1)
    dweights = dweights.reshape(tokens, k)  # (T, k)
    if cfg.normalize:
        chosen_sum = np.take_along_axis(routing.probs, routing.experts, axis=1).sum(axis=1, keepdims=True)
        dweights = (dweights - (dweights * routing.weights).sum(axis=1, keepdims=True)) / chosen_sum
    dprobs = np.zeros_like(routing.probs)  # (T, E)
    np.put_along_axis(dprobs, routing.experts, dweights, axis=1)
    dlogits = routing.probs * (dprobs - (dprobs * routing.probs).sum(axis=1, keepdims=True))  # (T, E)
    dx = dlogits @ w_gate.T  # (T, h)
    grads = {f"{name}.gate.w": x2d.T @ dlogits}
    if cfg.shared:
        ds, g_shared = mlp_backward(dy, c_shared)
        dx += ds
        grads |= g_shared
    return dx, drows, grads


# ---- single-device reference ----------------------------------------------------------------------


def moe_forward(p, name, x, cfg: MoEConfig):
    """x (b, s, h) -> y (b, s, h), every expert on this device. The b s tokens, in (b, s) order,
    are routed in groups of cfg.group_tokens, each with its own capacity (one pipeline
    microbatch's group per data-parallel rank, concatenated, gives that run's routing)."""
    b, s, h = x.shape
    x2d = x.reshape(-1, h)  # (T, h)
    size = cfg.group_tokens or len(x2d)
    if len(x2d) % size:
        raise ValueError(f"{name}: {len(x2d)} tokens do not split into routing groups of {size}")
    ys, caches = [], []
    for lo in range(0, len(x2d), size):
        group = x2d[lo : lo + size]  # (G, h)
        routing = _route_group(p, name, group, cfg)
        out, c_experts = experts_forward(
            p, name, range(cfg.num_experts), group[routing.slot_tokens], routing.tokens_per_expert
        )  # (A, h)
        y, c_source = _combine(p, name, group, routing, out, cfg)
        ys.append(y)
        caches.append((routing, c_source, c_experts))
    return np.concatenate(ys).reshape(b, s, h), caches


def moe_backward(dout, caches):
    """The groups' backward; their parameter gradients summed."""
    d2d = dout.reshape(-1, dout.shape[-1])  # (T, h)
    dxs, grads, lo = [], {}, 0
    for routing, c_source, c_experts in caches:
        hi = lo + len(routing.probs)
        dx, drows, g = _combine_backward(d2d[lo:hi], c_source)  # (G, h), (A, h)
        dxrows, g_experts = experts_backward(drows, c_experts)  # (A, h)
        np.add.at(dx, routing.slot_tokens, dxrows)
        dxs.append(dx)
        for n, value in (g | g_experts).items():
            grads[n] = grads[n] + value if n in grads else value
        lo = hi
    return np.concatenate(dxs).reshape(dout.shape), grads


# ---- expert parallelism ---------------------------------------------------------------------------


def _expert_major(arrived: np.ndarray) -> np.ndarray:
    """Arrival positions of the received rows, reordered from (source, expert, priority) to
    (expert, source, priority); arrived[src, e] = rows from src for local expert e."""
    starts = (np.cumsum(arrived) - arrived.reshape(-1)).reshape(arrived.shape)  # (ep, epr)
    sources, local_experts = arrived.shape
    return np.concatenate(
        [
            np.arange(starts[src, e], starts[src, e] + arrived[src, e])
            for e in range(local_experts)
            for src in range(sources)
        ]
    )


class ExpertParallelMoE:
    """One EP rank: its tokens' group, its experts (`experts_of_rank`), a replica of W_gate and of
    the shared expert. Expert grads are complete on the owning rank; W_gate and shared-expert
    grads are this rank's partials, which the caller sums over the EP ranks. (Under tensor
    parallelism each TP rank runs this on its share of the tokens, so every grad here is also a
    partial over the TP ranks: TensorParallelStage.grad_sync sums them.)

    `forward(x)` and `backward(dout)` are generators; each exchange is
    `received = yield ("all_to_all", send)` with `received` the pieces 0->r, ..., (n-1)->r
    (sim.collectives.ops). `send` is the counts (cut evenly), or `Pieces(flat, counts_row, shares)`:
    counts_row[j] elements go to rank j and shares[j] is that piece's size as a fraction of the
    exchange's even-routing size (rows to j / the group's nominal rows, `MoEConfig.nominal_rows`),
    which lets a timed run size each piece by the real routing. The combines (3 and 5) are
    `yield ("all_to_all", send, work)`: the rows this rank's experts just processed over their
    even share, how much longer than the cost model's estimate the experts took. In order:

      forward  1. counts   (int64) to rank j: this group's admitted rows for each of j's experts.
                           Element counts alone cannot say which local expert a row is for, so the
                           receiver learns its (source, expert) row counts from this small exchange
                           first. Megatron-core's all_to_all dispatcher gets the same numbers by an
                           all-gather of every rank's per-expert counts, then regroups arrivals by
                           expert (its sort_chunks_by_idxs, our `_expert_major`).
               2. dispatch x rows to their experts' ranks, in (expert, priority) order
               3. combine  expert outputs back, in arrival order; weighted and summed at the source
      backward 4. dispatch dL/d(expert output) rows, cut as in 2
               5. combine  dL/d(expert input) rows, cut as in 3 (the counts of 1 are reused)

    One forward may be pending at a time: backward consumes it.
    """

    def __init__(self, p, name: str, cfg: MoEConfig, ep: int, rank: int):
        self.name, self.cfg, self.ep, self.rank = name, cfg, ep, rank
        self.experts = experts_of_rank(rank, cfg.num_experts, ep)
        owners = [f"expert{e}" for e in self.experts] + (["shared"] if cfg.shared else [])
        names = [f"{name}.gate.w"] + [f"{name}.{o}.{suffix}" for o in owners for suffix in MLP_PARAMS]
        self.params = {n: p[n] for n in names}
        self._pending = None

    def forward(self, x):
        """Generator of exchanges 1-3; returns y (b, s, h) for this rank's tokens x (b, s, h)."""
        if self._pending is not None:
            raise RuntimeError(f"EP rank {self.rank}: a second forward before the backward of the first")
        b, s, h = x.shape
        x2d = x.reshape(-1, h)  # (T, h)
        if self.cfg.group_tokens not in (None, len(x2d)):
            raise ValueError(f"EP rank {self.rank}: {len(x2d)} tokens, but routing groups of {self.cfg.group_tokens}")
        nominal = self.cfg.nominal_rows(len(x2d))
        routing = _route_group(self.params, self.name, x2d, self.cfg)
        per_rank = routing.tokens_per_expert.reshape(self.ep, -1)  # (ep, epr): rows for each rank's experts
        received = yield ("all_to_all", per_rank.reshape(-1).astype(np.int64))
        arrived = received.reshape(self.ep, -1)  # (ep, epr): rows from each source for each local expert
        send = (per_rank.sum(axis=1) * h, per_rank.sum(axis=1) / nominal)  # (counts, shares) per destination
        back = (arrived.sum(axis=1) * h, arrived.sum(axis=1) / nominal)
        received = yield ("all_to_all", Pieces(x2d[routing.slot_tokens].reshape(-1), *send))
        order = _expert_major(arrived)
        out, c_experts = experts_forward(
            self.params, self.name, self.experts, received.reshape(-1, h)[order], arrived.sum(axis=0)
        )  # (R, h), expert-major
        in_arrival_order = np.empty_like(out)
        in_arrival_order[order] = out
        work = arrived.sum() / nominal
        out = yield ("all_to_all", Pieces(in_arrival_order.reshape(-1), *back), work)
        y, c_source = _combine(self.params, self.name, x2d, routing, out.reshape(-1, h), self.cfg)
        self._pending = (routing, c_source, c_experts, order, send, back, work)
        return y.reshape(b, s, h)

    def backward(self, dout):
        """Generator of exchanges 4-5; returns (dx (b, s, h), grads of this rank's parameters)."""
        if self._pending is None:
            raise RuntimeError(f"EP rank {self.rank}: backward without a forward")
        (routing, c_source, c_experts, order, send, back, work), self._pending = self._pending, None
        h = dout.shape[-1]
        dx, drows, grads = _combine_backward(dout.reshape(-1, h), c_source)  # (T, h), (A, h)
        received = yield ("all_to_all", Pieces(drows.reshape(-1), *send))
        dxrows, g_experts = experts_backward(received.reshape(-1, h)[order], c_experts)  # (R, h), expert-major
        in_arrival_order = np.empty_like(dxrows)
        in_arrival_order[order] = dxrows
        dxrows = yield ("all_to_all", Pieces(in_arrival_order.reshape(-1), *back), work)
        np.add.at(dx, routing.slot_tokens, dxrows.reshape(-1, h))
        return dx.reshape(dout.shape), grads | g_experts


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


def traffic_matrix(routings: list[Routing], ep: int, experts_per_rank: int, bytes_per_token: float) -> np.ndarray:
    """Dispatch bytes (ep, ep): [i, j] = admitted rows of rank i's group for rank j's experts times
    bytes_per_token (the diagonal stays on its rank). The combine moves the transpose."""
    if len(routings) != ep:
        raise ValueError(f"{len(routings)} routings for ep = {ep} ranks")
    for rank, r in enumerate(routings):
        if r.tokens_per_expert.size != ep * experts_per_rank:
            raise ValueError(
                f"rank {rank}: {r.tokens_per_expert.size} experts != ep ({ep}) x experts_per_rank ({experts_per_rank})"
            )
    rows = np.array([r.tokens_per_expert.reshape(ep, experts_per_rank).sum(axis=1) for r in routings])  # (ep, ep)
    return rows * float(bytes_per_token)
