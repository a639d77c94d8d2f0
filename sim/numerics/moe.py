"""A Mixture-of-Experts FFN in numpy with hand-written backward: the experts, their combine and the
single-device reference (the expert-parallel shard is sim/numerics/expert_parallel.py).

Routing (which experts each token goes to, admitted up to a capacity) is sim/numerics/routing.py;
here, for a group of T tokens x (T, h) and its routing (experts c_t, gate weights w_t):

    y_t  = sum over admitted i of w_ti MLP_{c_ti}(x_t)  +  MLP_shared(x_t)   (shared=True only)

The backward treats the top-k choice and the dropping as constants, as MoE implementations do;
gradients reach x through the experts and through the gate weights, the softmax and W_gate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from clustersim.sim.numerics.layers import INIT_STD, mlp_backward, mlp_forward
from clustersim.sim.numerics.routing import Routing, check_routing, route

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
    expert_groups: int = 1
    limited_groups: int | None = None

    def __post_init__(self) -> None:
        check_routing(self.num_experts, self.top_k, self.capacity_factor, self.expert_groups, self.limited_groups)
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
    mlp: dict[str, tuple[int, ...]] = {
        "fc.w": (hidden, ffn),
        "fc.b": (ffn,),
        "proj.w": (ffn, hidden),
        "proj.b": (hidden,),
    }
    shapes: dict[str, tuple[int, ...]] = {f"{name}.gate.w": (hidden, num_experts)}
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


def route_group(p, name, x2d, cfg: MoEConfig) -> Routing:
    w_gate = p[f"{name}.gate.w"]
    if w_gate.shape[1] != cfg.num_experts:
        raise ValueError(f"{name}.gate.w has {w_gate.shape[1]} experts, the config {cfg.num_experts}")
    return route(
        x2d,
        w_gate,
        cfg.top_k,
        cfg.capacity_factor,
        cfg.normalize,
        cfg.selection_bias,
        cfg.expert_groups,
        cfg.limited_groups,
    )


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


def combine(p, name, x2d, routing: Routing, out, cfg: MoEConfig):
    """At the tokens' source: y_t = sum of w * (expert output rows, slot order) + shared(x_t)."""
    y = np.zeros_like(x2d)  # (T, h)
    np.add.at(y, routing.slot_tokens, routing.slot_weights[:, None] * out)
    c_shared = None
    if cfg.shared:
        s, c_shared = mlp_forward(p, f"{name}.shared", x2d)  # (T, h)
        y += s
    return y, (name, x2d, p[f"{name}.gate.w"], routing, out, cfg, c_shared)


def combine_backward(dy, cache):
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
        routing = route_group(p, name, group, cfg)
        out, c_experts = experts_forward(
            p, name, range(cfg.num_experts), group[routing.slot_tokens], routing.tokens_per_expert
        )  # (A, h)
        y, c_source = combine(p, name, group, routing, out, cfg)
        ys.append(y)
        caches.append((routing, c_source, c_experts))
    return np.concatenate(ys).reshape(b, s, h), caches


def moe_backward(dout, caches):
    """The groups' backward; their parameter gradients summed."""
    d2d = dout.reshape(-1, dout.shape[-1])  # (T, h)
    dxs, grads, lo = [], {}, 0
    for routing, c_source, c_experts in caches:
        hi = lo + len(routing.probs)
        dx, drows, g = combine_backward(d2d[lo:hi], c_source)  # (G, h), (A, h)
        dxrows, g_experts = experts_backward(drows, c_experts)  # (A, h)
        np.add.at(dx, routing.slot_tokens, dxrows)
        dxs.append(dx)
        for n, value in (g | g_experts).items():
            grads[n] = grads[n] + value if n in grads else value
        lo = hi
    return np.concatenate(dxs).reshape(dout.shape), grads
