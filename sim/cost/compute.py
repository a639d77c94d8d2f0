"""Cost model: FLOPs and bytes of a transformer's pieces, and the time a GPU takes for them.

FLOPs count a multiply-add as 2. Per decoder layer, forward, for b sequences of s tokens, hidden
h and MLP width f (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", section 5.1, which gives 24bsh^2 + 4bs^2h for f = 4h):

    QKV projections      2 * b*s*h * 3h   = 6bsh^2  (grouped-query attention, keys and values of
                                               width h_kv = kv_heads x h/heads: 2bsh (h + 2 h_kv))
    scores Q K^T         2 * b*s*s * h    = 2bs^2h
    scores x V           2 * b*s*s * h    = 2bs^2h
    output projection    2 * b*s*h * h    = 2bsh^2

Where a head's width d is not h / heads (Qwen3: 32 heads of 128 at h = 2048), the queries and the
attention's output have width h_q = heads x d and the keys and values h_kv = kv_heads x d: QKV
2bsh (h_q + 2 h_kv), the core 4bs^2 h_q, the output projection 2bs h_q h.
    MLP                  2 * b*s*h * f * (2, or 3 for a gated MLP such as SwiGLU)

The LM head adds 2bshV on the last stage. Backward is twice the forward (gradients w.r.t.
inputs and weights). Time = FLOPs / (peak x efficiency).

An MoE layer (sim.presets.MoESpec: E routed experts of width f', top k, S shared experts, gated
or not: m = 3 or 2 matmuls per expert) replaces the MLP term, for T = b*s tokens, by

    router logits        2 * T * h * E
    routed experts       2 * R * h * f' * m,   R = T k rows (dropless, capacity_factor None),
                                               or E ceil(c T k / E) (capacity factor c: every
                                               expert's buffer, padded, as GShard and Switch)
    shared experts       2 * T * h * f' * m * S

so per token, dropless: 2h (E + f' m (k + S)). The softmax, top-k and weighted combine are a few
FLOPs per token and expert and are not counted; neither is any load imbalance (R assumes the
rows the routing admits, not the busiest expert's). Which layers are MoE layers is the
MoESpec's rule; `model_layer_*(spec, ..., i)` answer per layer for dense and MoE models alike.
"""

from __future__ import annotations

import math

from clustersim.sim.scenario.presets import ModelSpec, MoESpec

# Mixed-precision Adam touches per parameter: fp32 master weight, m and v read and written
# (3 x 4 B x 2), the 16-bit gradient read (2 B) and the 16-bit weight written (2 B).
ADAM_BYTES_PER_PARAM = 28


def attention_forward_flops(b: int, s: int, h: int, h_kv: int | None = None, h_q: int | None = None) -> float:
    """Forward FLOPs of a layer's attention: QKV, scores, scores x V, output projection; `h_kv`:
    the keys' and values' width under grouped-query attention, `h_q` the queries' (None: h)."""
    q = h if h_q is None else h_q
    kv = q if h_kv is None else h_kv
    return float(2 * b * s * h * (q + 2 * kv) + 4 * b * s * s * q + 2 * b * s * q * h)


def mlp_forward_flops(b: int, s: int, h: int, f: int, gated_mlp: bool) -> float:
    """Forward FLOPs of a layer's MLP: two (gated: three) h x f matmuls."""
    return float(2 * b * s * h * f * (3 if gated_mlp else 2))


def layer_forward_flops(
    b: int, s: int, h: int, f: int, gated_mlp: bool, h_kv: int | None = None, h_q: int | None = None
) -> float:
    """Forward FLOPs of one decoder layer (see the module docstring)."""
    return attention_forward_flops(b, s, h, h_kv, h_q) + mlp_forward_flops(b, s, h, f, gated_mlp)


def recompute_flops(
    b: int, s: int, h: int, f: int, gated_mlp: bool, mode: str, h_kv: int | None = None, h_q: int | None = None
) -> float:
    """FLOPs a backward adds per layer to recompute what the forward did not keep: the whole
    forward (full), or the attention core Q K^T and x V, 4bs^2 h_q (selective, Korthikanti et al.
    2022 section 5), or nothing."""
    if mode == "full":
        return layer_forward_flops(b, s, h, f, gated_mlp, h_kv, h_q)
    return 4.0 * b * s * s * (h if h_q is None else h_q) if mode == "selective" else 0.0


def head_forward_flops(b: int, s: int, h: int, vocab: int) -> float:
    """Forward FLOPs of the LM head's logits, 2bshV."""
    return float(2 * b * s * h * vocab)


def attention_params(h: int, h_kv: int | None = None, h_q: int | None = None) -> int:
    """Parameters of a layer's attention: QKV (queries of width `h_q`, keys and values of width
    `h_kv`; None: h) and output projections with biases."""
    q = h if h_q is None else h_q
    qkv = q + 2 * (q if h_kv is None else h_kv)
    return h * qkv + qkv + q * h + h


def mlp_params(h: int, f: int, gated_mlp: bool) -> int:
    """Parameters of an MLP of width f: two (gated: three) h x f matrices and two biases."""
    return (3 if gated_mlp else 2) * h * f + f + h


def layer_params(h: int, f: int, gated_mlp: bool, h_kv: int | None = None, h_q: int | None = None) -> int:
    """Parameters of one decoder layer: QKV and output projections with biases, MLP, 2 layernorms."""
    return attention_params(h, h_kv, h_q) + mlp_params(h, f, gated_mlp) + 4 * h


# --- Mixture-of-Experts layers (module docstring) ----------------------------------------------


def moe_routed_rows(b: int, s: int, moe: MoESpec) -> int:
    """Token rows the routed experts process for T = b*s tokens: T k (dropless), or with capacity
    factor c every expert's full buffer, E ceil(c T k / E) (sim.numerics.moe's capacity rule)."""
    tokens = b * s
    if moe.capacity_factor is None:
        return tokens * moe.top_k
    return moe.num_experts * math.ceil(moe.capacity_factor * tokens * moe.top_k / moe.num_experts)


def moe_router_flops(b: int, s: int, h: int, moe: MoESpec) -> float:
    """Forward FLOPs of the router's h x E logits for b*s tokens."""
    return float(2 * b * s * h * moe.num_experts)


def moe_mlp_forward_flops(b: int, s: int, h: int, moe: MoESpec, gated_mlp: bool) -> float:
    """Forward FLOPs of an MoE layer's MLP part for b sequences of s tokens: the router, the routed
    experts' rows (`moe_routed_rows`) and the shared experts, each expert an MLP of width expert_ffn."""
    tokens = b * s
    per_row = mlp_forward_flops(1, 1, h, moe.expert_ffn, gated_mlp)  # 2 h f' (2 or 3)
    rows = moe_routed_rows(b, s, moe) + tokens * moe.shared_experts
    return moe_router_flops(b, s, h, moe) + rows * per_row


def moe_mlp_params(h: int, moe: MoESpec, gated_mlp: bool) -> int:
    """Parameters of an MoE layer's MLP part: routed and shared experts (MLPs of width expert_ffn,
    with biases, like the dense MLP) and the h x E router (no bias)."""
    experts = moe.num_experts + moe.shared_experts
    return experts * mlp_params(h, moe.expert_ffn, gated_mlp) + h * moe.num_experts


def moe_mlp_active_params(h: int, moe: MoESpec, gated_mlp: bool) -> int:
    """Parameters of an MoE layer's MLP part one token uses: top_k routed experts, the shared
    experts and the router."""
    experts = moe.top_k + moe.shared_experts
    return experts * mlp_params(h, moe.expert_ffn, gated_mlp) + h * moe.num_experts


def moe_layer_params(h: int, moe: MoESpec, gated_mlp: bool, h_kv: int | None = None, h_q: int | None = None) -> int:
    """Parameters of one MoE decoder layer: attention, 2 layernorms, and the MoE MLP (all routed
    experts, the shared ones and the router); `layer_params` with `moe_mlp_params` for the MLP."""
    return attention_params(h, h_kv, h_q) + 4 * h + moe_mlp_params(h, moe, gated_mlp)


# --- per layer of a ModelSpec: dense or MoE by the spec's rule ---------------------------------


def _check_layer(spec: ModelSpec, i: int) -> None:
    if not 0 <= i < spec.layers:
        raise ValueError(f"layer {i} is outside 0..{spec.layers - 1}")


def _layer_moe(spec: ModelSpec, i: int) -> MoESpec | None:
    """The spec's MoESpec when layer i is an MoE layer, None when it is dense."""
    _check_layer(spec, i)
    return spec.moe if spec.moe is not None and spec.moe.is_moe_layer(i) else None


def model_layer_forward_flops(spec: ModelSpec, b: int, i: int) -> float:
    """Forward FLOPs of layer i of `spec` for b sequences of spec.seq_len tokens: attention plus
    the dense MLP (width spec.ffn) or, in an MoE layer, `moe_mlp_forward_flops`."""
    s, h, kv, q = spec.seq_len, spec.hidden, spec.kv_hidden, spec.q_hidden
    if (moe := _layer_moe(spec, i)) is not None:
        return attention_forward_flops(b, s, h, kv, q) + moe_mlp_forward_flops(b, s, h, moe, spec.gated_mlp)
    return layer_forward_flops(b, s, h, spec.ffn, spec.gated_mlp, kv, q)


def model_layer_recompute_flops(spec: ModelSpec, b: int, i: int, mode: str) -> float:
    """`recompute_flops` of layer i of `spec`: the whole layer's forward (full; an MoE layer's
    includes its experts), the attention core 4bs^2 h_q (selective), or nothing."""
    if mode == "full":
        return model_layer_forward_flops(spec, b, i)
    _check_layer(spec, i)
    return recompute_flops(b, spec.seq_len, spec.hidden, spec.ffn, spec.gated_mlp, mode, h_q=spec.q_hidden)


def model_layer_params(spec: ModelSpec, i: int) -> int:
    """Parameters of layer i of `spec`: `layer_params`, or `moe_layer_params` in an MoE layer, and
    the query and key norms' weights (one head's width each) where the spec has them."""
    norms = 2 * spec.head_width if spec.qk_norm else 0
    if (moe := _layer_moe(spec, i)) is not None:
        return moe_layer_params(spec.hidden, moe, spec.gated_mlp, spec.kv_hidden, spec.q_hidden) + norms
    return layer_params(spec.hidden, spec.ffn, spec.gated_mlp, spec.kv_hidden, spec.q_hidden) + norms


def model_layer_active_params(spec: ModelSpec, i: int) -> int:
    """Parameters of layer i one token uses: all of a dense layer's; an MoE layer's attention,
    layernorms, router, shared experts and top_k routed experts."""
    h, kv, q = spec.hidden, spec.kv_hidden, spec.q_hidden
    norms = 2 * spec.head_width if spec.qk_norm else 0
    if (moe := _layer_moe(spec, i)) is not None:
        return attention_params(h, kv, q) + 4 * h + moe_mlp_active_params(h, moe, spec.gated_mlp) + norms
    return layer_params(h, spec.ffn, spec.gated_mlp, kv, q) + norms


def boundary_activation_bytes(b: int, s: int, h: int, dtype_bytes: int) -> float:
    """Bytes of the activation (or its gradient) crossing a pipeline stage boundary: s x b x h."""
    return float(s * b * h * dtype_bytes)


def compute_time_s(flops: float, peak_flops: float, efficiency: float) -> float:
    """Time of a compute-bound op: FLOPs / (peak FLOP/s x achievable fraction)."""
    return flops / (peak_flops * efficiency)


def memory_time_s(nbytes: float, hbm_bandwidth_Bps: float) -> float:
    """Time of a memory-bound op (the optimizer step): bytes touched / HBM bandwidth."""
    return nbytes / hbm_bandwidth_Bps
