"""Memory per rank, as formulas of sizes: model states (ZeRO-sharded) and activations per layer.
The timeline over a run is sim/results/memory.py.

Model states, mixed-precision Adam (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", arXiv:1910.02054, section 3.1 and section 5 / Figure 1).
Per parameter: a 16-bit weight (2 B), a 16-bit gradient (2 B) and K = 12 B of optimizer state
(fp32 master weight, Adam momentum and variance, 4 B each). With Psi parameters on a rank and
Nd data-parallel ranks sharing them:

    stage 0 (plain DP)     (2 + 2 + K) Psi
    stage 1 (P_os)         2 Psi + 2 Psi + K Psi / Nd
    stage 2 (P_os+g)       2 Psi + (2 + K) Psi / Nd
    stage 3 (P_os+g+p)     (2 + 2 + K) Psi / Nd

Activations per transformer layer, 16-bit, for sequence s, microbatch b, hidden h, heads a,
tensor-parallel degree t (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", arXiv:2205.05198; section 4.1 derives 34sbh + 5as^2b: attention 11sbh + 5as^2b,
MLP 19sbh, two layernorms 4sbh; section 4.2 tensor and sequence parallelism; section 5 selective
recomputation; Table 2 collects them):

    no parallelism                      sbh (34 + 5as/h)
    tensor parallel                     sbh (10 + 24/t + 5as/(ht))
    tensor + sequence parallel          sbh/t (34 + 5as/h)
    tensor parallel + selective         sbh (10 + 24/t)
    tensor + sequence + selective       sbh (34/t)
    full recomputation                  2 sbh   (only the layer input is kept)
"""

from __future__ import annotations

RECOMPUTE_MODES = ("none", "selective", "full")
ADAM_K = 12  # bytes of optimizer state per parameter: fp32 master weight, momentum, variance


def model_state_bytes(
    params_per_rank: float, zero_stage: int, dp: int, k: int = ADAM_K, grad_bytes: float = 2.0
) -> dict[str, float]:
    """Bytes of weights, gradients and optimizer state on one rank (see the module docstring).

    `params_per_rank` is Psi after the tensor- and pipeline-parallel split (the caller computes
    it); `dp` is Nd, the data-parallel ranks that shard it under ZeRO; `k` is the optimizer's
    bytes per parameter (12 for mixed-precision Adam); `grad_bytes` a gradient's (2, or 4 in
    Megatron-LM's FP32 gradient buffer: Scenario.gradient_bytes). weights = 2 Psi (/ Nd at stage
    3); gradients = grad_bytes Psi (/ Nd at stages 2 and 3); optimizer = K Psi (/ Nd at stages 1 to 3).
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, not {zero_stage!r}")
    if dp < 1:
        raise ValueError(f"dp must be at least 1, not {dp!r}")
    if params_per_rank < 0:
        raise ValueError(f"params_per_rank must be >= 0, not {params_per_rank!r}")
    psi = float(params_per_rank)
    return {
        "weights": 2 * psi / (dp if zero_stage >= 3 else 1),
        "gradients": grad_bytes * psi / (dp if zero_stage >= 2 else 1),
        "optimizer": k * psi / (dp if zero_stage >= 1 else 1),
    }


def activation_bytes_per_layer(
    s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False, recompute: str = "none", h_kv: int | None = None
) -> float:
    """Bytes one transformer layer keeps for its backward, per microbatch (module docstring).

    16-bit activations and 1-byte dropout masks, as in Korthikanti et al. (section 4.1). The
    linear part is 10sbh replicated across the tensor-parallel group (layernorm and dropout inputs)
    + 24sbh/t split by it; sequence parallelism splits the 10sbh too, giving 34sbh/t. The attention
    scores, softmax and dropout mask are 5as^2b, split by heads: 5as^2b/t. Selective recompute drops
    that term (section 5); full recompute keeps only the layer input, 2sbh (Table 2). With sequence
    parallelism that input is the sequence shard, 2sbh/t: our reading of Megatron, not a row of
    Table 2 (which lists full recompute without sequence parallelism). The formulas are for the
    paper's GPT layer (MLP width 4h, GeLU, dropout on); a gated MLP (SwiGLU) or another width keeps
    more, which is not modelled. Under grouped-query attention (`h_kv`: the keys' and values' width)
    the QK^T input keeps K and the context keeps V at width h_kv: 4sb(h - h_kv)/t less.
    """
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"unknown recompute {recompute!r} (valid: {', '.join(RECOMPUTE_MODES)})")
    if t < 1:
        raise ValueError(f"tensor-parallel degree t must be at least 1, not {t!r}")
    sbh = float(s) * b * h
    if recompute == "full":
        return 2.0 * sbh / (t if sp else 1)
    linear = 34.0 / t if sp else 10.0 + 24.0 / t  # x sbh
    if h_kv is not None:
        linear -= 4.0 * (h - h_kv) / (h * t)
    scores = 0.0 if recompute == "selective" else 5.0 * a * s / (h * t)  # 5as^2b/t, as a multiple of sbh
    return sbh * (linear + scores)
