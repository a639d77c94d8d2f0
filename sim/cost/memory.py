"""Memory per rank, as formulas of sizes: model states (ZeRO-sharded) and activations (per layer,
the embedding's and the LM head's).
The timeline over a run is sim/results/memory.py.

Model states, mixed-precision Adam (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", arXiv:1910.02054, section 3.1 and section 5 / Figure 1).
Per parameter: a 16-bit weight (2 B), a 16-bit gradient (2 B; 4 B in Megatron-LM's FP32 gradient
buffer, `grad_bytes` below, where the 2 of the table reads 4) and K = 12 B of optimizer state
(fp32 master weight, Adam momentum and variance, 4 B each). With Psi parameters on a rank and
Nd data-parallel ranks sharing them:

    stage 0 (plain DP)     (2 + 2 + K) Psi
    stage 1 (P_os)         2 Psi + 2 Psi + K Psi / Nd
    stage 2 (P_os+g)       2 Psi + (2 + K) Psi / Nd
    stage 3 (P_os+g+p)     (2 + 2 + K) Psi / Nd

Activations per transformer layer (Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models", arXiv:2205.05198). Section 4.1 lists what a layer keeps for its backward,
16-bit tensors and 1-byte dropout masks; here with sequence s, microbatch b, hidden h, heads a, the
keys' and values' width h_kv (grouped-query attention) and the MLP's width f:

    kept whatever t (10sbh): two layernorm inputs 4sbh, the QKV and FC1 inputs 4sbh, the
        attention-output and MLP-output dropout masks 2sbh
    split by tensor parallelism t: Q and K (QK^T's inputs) 2sbh + 2sb h_kv, V 2sb h_kv, the
        projection's input 2sbh; the MLP's activation input 2sbf and FC2 input 2sbf
    attention core, split by t: softmax 2as^2b, its dropout mask as^2b, the dropout output 2as^2b

Sequence parallelism splits the first row t ways too (section 4.2.2). The paper's GPT layer
(h_kv = h, f = 4h, GeLU) gives 34sbh + 5as^2b and Table 2:

    no parallelism                      sbh (34 + 5as/h)
    tensor parallel                     sbh (10 + 24/t + 5as/(ht))
    tensor + sequence parallel          sbh/t (34 + 5as/h)
    tensor parallel + selective         sbh (10 + 24/t)
    tensor + sequence + selective       sbh (34/t)
    full recomputation                  2 sbh   (only the layer input is kept)

Beyond the paper's layer:
- gated MLP (SwiGLU): FC1's output is 2f wide and the activation keeps both halves (Megatron-Core's
  fused SwiGLU saves its whole input, megatron/core/fusions/fused_bias_swiglu.py), so the
  activation's input is 4sbf and the MLP keeps 6sbf + 3sbh instead of 4sbf + 3sbh.
- flash attention keeps no s x s tensor: FlashAttention-2 saves q, k, v, its output (the
  projection's input, counted above) and the fp32 logsumexp of each (batch, head, query row), and
  regenerates its dropout mask from the saved RNG state (Dao 2023, arXiv:2307.08691, Algorithm 1
  writes only O and L; Dao et al. 2022, arXiv:2205.14135, section 3.1 on dropout;
  Dao-AILab/flash-attention flash_attn/flash_attn_interface.py, FlashAttnFunc.forward's
  save_for_backward, softmax_lse of shape (batch, heads, seqlen_q) in float32): 4asb, split by t.
- selective recompute with flash attention: the checkpointed core's inputs Q, K, V are kept
  anyway and its output is the projection's input, so only the logsumexp goes: the linear terms.
- without dropout (model.hidden_dropout, model.attention_dropout 0, as Llama, Mixtral, Qwen3 and
  NeMo's Nemotron train: NeMo-Framework-Launcher conf/training/llama/llama2_7b.yaml and
  nemotron/nemotron_8b.yaml, hidden_dropout and attention_dropout 0.0) PyTorch's dropout returns
  its input and keeps no mask: the two hidden dropout masks 2sbh go (/t under sequence
  parallelism); without attention dropout the context GEMM reads the softmax's output itself, so
  the core keeps only that, 2as^2b of the 5as^2b.
Activations are 16-bit whatever training.fp8 (Transformer Engine may keep FP8 copies of GEMM
inputs instead: not modelled). An MoE layer is counted as a dense MLP of width f.

Outside the layers (Megatron-Core, megatron/core/tensor_parallel/):
- the LM head's stage keeps the final layernorm's input 2sbh, the head GEMM's input 2sbh (both /t
  under sequence parallelism: the column-parallel GEMM saves its sequence shard and gathers it
  again in the backward, layers.py), and the vocab-parallel cross-entropy's fp32 softmax over
  sb x V/t logits with its target mask (bool) and masked targets (int64) per token:
  4sbV/t + 9sb (cross_entropy.py, save_for_backward).
- the embedding's stage keeps the int64 token ids its lookup's backward scatters by, 8sb (and the
  bool mask of ids outside the rank's vocabulary shard when t > 1, sb), and the embedding dropout's
  mask sbh (/t under sequence parallelism) (layers.py VocabParallelEmbedding;
  models/common/embeddings/language_model_embedding.py). Full recompute checkpoints the layers
  only: both are kept under every recompute mode.
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
    s: int,
    b: int,
    h: int,
    a: int,
    t: int = 1,
    sp: bool = False,
    recompute: str = "none",
    h_kv: int | None = None,
    f: int | None = None,
    gated_mlp: bool = False,
    flash: bool = False,
    h_q: int | None = None,
    qk_norm: bool = False,
    hidden_dropout: bool = True,
    attention_dropout: bool = True,
) -> float:
    """Bytes one transformer layer keeps for its backward, per microbatch (module docstring).

    `h_kv`: the keys' and values' width (default h); `h_q`: the queries' (default h; heads wider or
    narrower than h / a); `qk_norm`: the query and key norms keep their inputs, 2sb (h_q + h_kv);
    `f`: the MLP's width (default 4h); `gated_mlp`: a SwiGLU MLP; `flash`: fused flash attention;
    `hidden_dropout`, `attention_dropout`: whether each dropout runs (p > 0) and keeps its mask.
    Selective recompute drops the attention core's term (section 5); full recompute keeps only the
    layer input, 2sbh (Table 2), a sequence shard 2sbh/t under sequence parallelism: our reading of
    Megatron, not a row of Table 2 (which lists full recompute without sequence parallelism).
    """
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"unknown recompute {recompute!r} (valid: {', '.join(RECOMPUTE_MODES)})")
    if t < 1:
        raise ValueError(f"tensor-parallel degree t must be at least 1, not {t!r}")
    sb = float(s) * b
    if recompute == "full":
        return 2.0 * sb * h / (t if sp else 1)
    q = h if h_q is None else h_q
    h_kv = q if h_kv is None else h_kv
    f = 4 * h if f is None else f
    whole = (10.0 if hidden_dropout else 8.0) * sb * h  # layernorm inputs, QKV and FC1 inputs, two dropout masks
    attention = sb * (2 * q + 2 * h_kv + 2 * h_kv + 2 * q)  # Q, K, V, the projection's input
    attention += 2 * sb * (q + h_kv) if qk_norm else 0.0  # the query and key norms' inputs
    mlp = sb * (4 * f if gated_mlp else 2 * f) + 2 * sb * f  # the activation's input, FC2's input
    if recompute == "selective":
        core = 0.0
    elif flash:
        core = 4.0 * a * sb  # fp32 logsumexp per (batch, head, query row)
    else:
        core = (5.0 if attention_dropout else 2.0) * a * s * sb  # softmax, its dropout mask, the dropout output
    return (whole / t if sp else whole) + (attention + mlp + core) / t


def head_activation_bytes(s: int, b: int, h: int, vocab: int, t: int = 1, sp: bool = False) -> float:
    """Bytes the LM head's stage keeps per microbatch beyond its layers (module docstring): the final
    layernorm's and the head GEMM's inputs, 4sbh (/t under sequence parallelism), and the
    cross-entropy's (`cross_entropy_activation_bytes`)."""
    return 4.0 * float(s) * b * h / (t if sp else 1) + cross_entropy_activation_bytes(s, b, vocab, t)


def cross_entropy_activation_bytes(s: int, b: int, vocab: int, t: int = 1) -> float:
    """The vocab-parallel cross-entropy's fp32 softmax over the rank's vocabulary shard and its
    targets, 4sbV/t + 9sb: only the input gradient reads them (no weight gradient does)."""
    sb = float(s) * b
    return 4.0 * sb * vocab / t + 9.0 * sb


def embedding_activation_bytes(s: int, b: int, h: int, t: int = 1, sp: bool = False, dropout: bool = True) -> float:
    """Bytes the embedding's stage keeps per microbatch beyond its layers (module docstring): the
    int64 token ids 8sb, their out-of-shard mask sb when t > 1, the dropout mask sbh (/t under
    sequence parallelism) where its (hidden) dropout runs."""
    sb = float(s) * b
    return 8.0 * sb + (sb if t > 1 else 0.0) + (sb * h / (t if sp else 1) if dropout else 0.0)
