"""Cost model: FLOPs and bytes of a transformer's pieces, and the time a GPU takes for them.

FLOPs count a multiply-add as 2. Per decoder layer, forward, for b sequences of s tokens, hidden
h and MLP width f (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", section 5.1, which gives 24bsh^2 + 4bs^2h for f = 4h):

    QKV projections      2 * b*s*h * 3h   = 6bsh^2
    scores Q K^T         2 * b*s*s * h    = 2bs^2h
    scores x V           2 * b*s*s * h    = 2bs^2h
    output projection    2 * b*s*h * h    = 2bsh^2
    MLP                  2 * b*s*h * f * (2, or 3 for a gated MLP such as SwiGLU)

The LM head adds 2bshV on the last stage. Backward is twice the forward (gradients w.r.t.
inputs and weights). Time = FLOPs / (peak x efficiency).
"""

from __future__ import annotations

# Mixed-precision Adam touches per parameter: fp32 master weight, m and v read and written
# (3 x 4 B x 2), the 16-bit gradient read (2 B) and the 16-bit weight written (2 B).
ADAM_BYTES_PER_PARAM = 28


def attention_forward_flops(b: int, s: int, h: int) -> float:
    """Forward FLOPs of a layer's attention: QKV, scores, scores x V, output projection."""
    return float(6 * b * s * h * h + 4 * b * s * s * h + 2 * b * s * h * h)


def mlp_forward_flops(b: int, s: int, h: int, f: int, gated_mlp: bool) -> float:
    """Forward FLOPs of a layer's MLP: two (gated: three) h x f matmuls."""
    return float(2 * b * s * h * f * (3 if gated_mlp else 2))


def layer_forward_flops(b: int, s: int, h: int, f: int, gated_mlp: bool) -> float:
    """Forward FLOPs of one decoder layer (see the module docstring)."""
    return attention_forward_flops(b, s, h) + mlp_forward_flops(b, s, h, f, gated_mlp)


def recompute_flops(b: int, s: int, h: int, f: int, gated_mlp: bool, mode: str) -> float:
    """FLOPs a backward adds per layer to recompute what the forward did not keep: the whole
    forward (full), or the attention core Q K^T and x V, 4bs^2h (selective, Korthikanti et al.
    2022 section 5), or nothing."""
    if mode == "full":
        return layer_forward_flops(b, s, h, f, gated_mlp)
    return 4.0 * b * s * s * h if mode == "selective" else 0.0


def head_forward_flops(b: int, s: int, h: int, vocab: int) -> float:
    """Forward FLOPs of the LM head's logits, 2bshV."""
    return float(2 * b * s * h * vocab)


def layer_params(h: int, f: int, gated_mlp: bool) -> int:
    """Parameters of one decoder layer: QKV and output projections with biases, MLP, 2 layernorms."""
    attention = 3 * h * h + 3 * h + h * h + h
    mlp = (3 if gated_mlp else 2) * h * f + f + h
    return attention + mlp + 4 * h


def boundary_activation_bytes(b: int, s: int, h: int, dtype_bytes: int) -> float:
    """Bytes of the activation (or its gradient) crossing a pipeline stage boundary: s x b x h."""
    return float(s * b * h * dtype_bytes)


def compute_time_s(flops: float, peak_flops: float, efficiency: float) -> float:
    """Time of a compute-bound op: FLOPs / (peak FLOP/s x achievable fraction)."""
    return flops / (peak_flops * efficiency)


def memory_time_s(nbytes: float, hbm_bandwidth_Bps: float) -> float:
    """Time of a memory-bound op (the optimizer step): bytes touched / HBM bandwidth."""
    return nbytes / hbm_bandwidth_Bps
