"""A decoder layer (and the embedding and LM head around it) as the kernels Megatron-LM runs for
it on one tensor-parallel rank, with their real shapes, each timed by sim.cost.gemm.

For b sequences of s tokens (T = b s), hidden h, a heads of d = h / a (or head_dim), MLP width f, tensor
parallel t (a/t heads and f/t columns per rank; sequence parallel: the norms and residuals see
T/t tokens), per work item of schedules.tensor_parallel.tp_stage_plan:

    attn     layernorm (T_sp x h); QKV GEMM (T x 3h/t x h; grouped-query (h + 2 h_kv)/t, heads of their
             own width d: (h_q + 2 h_kv)/t); norms over Q and K (qk_norm); RoPE on Q and K
             (rotary position embeddings only); attention core:
             scores Q K^T, batched b a/t times (s x s x d), softmax and dropout over (b a/t s s), context
             P V (s x d x s), or one fused flash-attention kernel; output projection (T x h x h_q/t); dropout+residual
    mlp      layernorm; FC1 (T x f/t x h; gated: 2f/t, gate and up in one GEMM); GeLU or SwiGLU;
             FC2 (T x h x f/t); dropout+residual
    embed    token (+ learned position) lookup (T x h), dropout
    head     final layernorm; logits (T x V/t x h); vocab-parallel cross-entropy over (T x V/t)
    router   logits (T/t x E x h); softmax and top-k; permute the routed rows (R/t of h)
    experts  grouped FC1 and FC2 over the E/ep local experts (R/t rows, evenly), the shared
             experts' FC1 and FC2 (T/t rows), the activations, unpermute and weighted combine

A GEMM Y (m x n) = X (m x k) W (k x n) has a backward of two GEMMs of the same FLOPs: the input
gradient dX = dY W^T (m x k x n) and the weight gradient dW = X^T dY (k x n x m); the weight
gradients are the W part a zero-bubble schedule splits off (sim.cost.stages), everything else of
the backward (input gradients, the attention core's gradients, element-wise backward) is B.
Element-wise kernels move bytes per element as listed at each one (dt = dtype bytes, masks 1 B).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from clustersim.sim.cost import flash_attention, gemm
from clustersim.sim.cost.attention_core import unfused_core
from clustersim.sim.cost.compute import moe_routed_rows
from clustersim.sim.cost.kernel import Kernel, Pair
from clustersim.sim.cost.shapes import Shapes
from clustersim.sim.scenario.chips import ChipSpec
from clustersim.sim.scenario.hardware import GpuSpec

ITEMS = ("attn", "mlp", "embed", "head", "router", "experts")

# Megatron's vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py; 2022's mpu/
# the same) in fp32 over each rank's (T x V/t) logits, bytes per logit: forward cast 2 + 4, max 4,
# subtract it 4 + 4, exp 4 + 4, sum 4, divide (the softmax the backward keeps) 4 + 4 = 38;
# backward softmax minus one-hot, scaled 4 + 4, cast for the GEMM 4 + 2 = 14.
CROSS_ENTROPY_FORWARD_BYTES = 38
CROSS_ENTROPY_BACKWARD_BYTES = 14
# The router's fp32 softmax and top-k over (T/t x E) scores: read and write 4 + 4; backward 4 + 4 + 4.
ROUTER_SOFTMAX_FORWARD_BYTES = 8
ROUTER_SOFTMAX_BACKWARD_BYTES = 12


@dataclass(frozen=True)
class ItemKernels:
    """A work item's forward and backward kernels; `core` is the attention core's forward, what
    selective recompute runs again before the backward (Korthikanti et al. 2022, section 5)."""

    forward: tuple[Kernel, ...]
    backward: tuple[Kernel, ...]
    core: tuple[Kernel, ...] = ()


class LayerKernels:
    """The kernels of each work item (ITEMS) at these shapes on this chip."""

    def __init__(self, chip: ChipSpec, gpu: GpuSpec, shapes: Shapes):
        self.chip, self.gpu, self.sh = chip, gpu, shapes

    def on_chip(self, chip: ChipSpec) -> LayerKernels:
        """The same shapes on another description of the chip."""
        return LayerKernels(chip, self.gpu, self.sh)

    # --- building blocks ---------------------------------------------------------------------

    def gemm_pair(
        self, name: str, m: int, n: int, k: int, batch: int = 1, klass: str = "gemm", weights: bool = True
    ) -> Pair:
        """Forward Y (m x n) = X (m x k) W (k x n), `batch` times; its input gradient (m x k x n)
        and its other operand's gradient (k x n x m): a weight's (W part), or an activation's (B)."""
        c, g, dt = self.chip, self.gpu, self.sh.dtype_bytes
        flops = 2.0 * m * n * k * batch
        forward = Kernel(name, klass, "F", gemm.gemm_time_s(c, g, m, n, k, batch, dt), flops)
        dgrad = Kernel(f"{name} dgrad", klass, "B", gemm.gemm_time_s(c, g, m, k, n, batch, dt), flops)
        part, held = ("W", float(k * n * batch)) if weights else ("B", 0.0)
        wgrad_s = gemm.gemm_time_s(c, g, k, n, m, batch, dt, accumulate_fp32=weights and self.sh.fp32_weight_gradients)
        wgrad = Kernel(f"{name} wgrad", klass, part, wgrad_s, flops, held)
        return [forward], [dgrad, wgrad]

    def _linear(self, name: str, m: int, n: int, k: int, batch: int = 1) -> Pair:
        """A linear layer's GEMM (Transformer Engine's modules in Megatron): `_gemm`, or with FP8 its
        GEMMs at the FP8 rate, after casting X (m x k) and dY (m x n) to row- and column-wise FP8
        copies (read dt, write 2 bytes per element; an upper bound, TE fuses some of them); the
        input- and weight-gradient GEMMs with TE's split accumulator (sim.scenario.chips)."""
        if not self.sh.fp8:
            return self.gemm_pair(name, m, n, k, batch)
        c, g, dt, flops = self.chip, self.gpu, self.sh.dtype_bytes, 2.0 * m * n * k * batch

        def fp8(label: str, part: str, rows: int, cols: int, inner: int) -> Kernel:
            fp32 = part == "W" and self.sh.fp32_weight_gradients  # weight gradients into their FP32 buffer
            split = part != "F"  # dgrad and wgrad: TE's _2X_ACC_DGRAD and _2X_ACC_WGRAD
            time_s = gemm.gemm_time_s(c, g, rows, cols, inner, batch, dt, True, fp32, split)
            return Kernel(label, "gemm", part, time_s, flops, float(k * n * batch) if part == "W" else 0.0)

        def cast(label: str, part: str, elements: int) -> Kernel:
            return Kernel(f"{label} FP8 cast", "elementwise", part, gemm.elementwise_time_s(c, g, elements * (dt + 2)))

        forward = [cast(name, "F", batch * m * k), fp8(name, "F", m, n, k)]
        dy = cast(f"{name} dY", "B", batch * m * n)
        return forward, [dy, fp8(f"{name} dgrad", "B", m, k, n), fp8(f"{name} wgrad", "W", k, n, m)]

    def elementwise(
        self, name: str, elements: float, forward_bytes: float, backward_bytes: float, klass="elementwise", part="B"
    ) -> Pair:
        """An element-wise kernel over `elements` moving the given bytes per element each way."""
        c, g = self.chip, self.gpu
        forward = Kernel(name, klass, "F", gemm.elementwise_time_s(c, g, elements * forward_bytes))
        backward = Kernel(f"{name} backward", klass, part, gemm.elementwise_time_s(c, g, elements * backward_bytes))
        return [forward], [backward]

    def _norm(self, tokens: float) -> Pair:
        """Layernorm: read x, write y (2 dt); backward read x and dy, write dx (3 dt)."""
        dt = self.sh.dtype_bytes
        return self.elementwise("layernorm", tokens * self.sh.hidden, 2 * dt, 3 * dt)

    def _dropout_add(self, tokens: float) -> Pair:
        """Fused bias-dropout-add: read x and the residual, write y and the mask (3 dt + 1);
        backward read dy and the mask, write dx (2 dt + 1). Without hidden dropout the residual
        add alone (3 dt), whose backward hands dy to both inputs as it is: no kernel."""
        dt = self.sh.dtype_bytes
        if not self.sh.hidden_dropout:
            forward, _ = self.elementwise("residual add", tokens * self.sh.hidden, 3 * dt, 0)
            return forward, []
        return self.elementwise("dropout+residual", tokens * self.sh.hidden, 3 * dt + 1, 2 * dt + 1)

    @staticmethod
    def join(*pairs: Pair) -> ItemKernels:
        """Pieces run in order forward, their backwards in reverse order."""
        return ItemKernels(tuple(k for f, _ in pairs for k in f), tuple(k for _, b in reversed(pairs) for k in b))

    # --- the work items -----------------------------------------------------------------------

    @property
    def _tokens(self) -> int:
        return self.sh.micro_batch * self.sh.seq_len

    @property
    def _norm_tokens(self) -> float:
        """Tokens a norm or residual sees on one rank: T, or T/t in a sequence-parallel region."""
        return self._tokens / self.sh.tp if self.sh.sequence_parallel else self._tokens

    def attention_core(self) -> Pair:
        """Scores, softmax, dropout and context of a/t heads (sim.cost.attention_core), or one
        flash-attention kernel."""
        sh = self.sh
        heads = sh.micro_batch * sh.heads // sh.tp  # (batch x heads) per rank
        s, d = sh.seq_len, sh.head_width
        if sh.flash_attention:
            flops = 4.0 * heads * s * s * d  # Megatron's count: Q K^T and P V, no causal skip
            c, g = self.chip, self.gpu
            dt = sh.dtype_bytes
            forward_s = flash_attention.time_s(c, g, heads, s, d, backward=False, dtype_bytes=dt)
            forward = Kernel("flash attention", "attention_core", "F", forward_s, flops)
            backward_s = flash_attention.time_s(c, g, heads, s, d, backward=True, dtype_bytes=dt)
            backward = Kernel("flash attention backward", "attention_core", "B", backward_s, 2 * flops)
            return [forward], [backward]
        return unfused_core(self)

    def _rope(self) -> Pair:
        """Rotary embeddings as Megatron-Core applies them with apply_rope_fusion (NeMo's Llama and
        Nemotron configs): Transformer Engine's fused RoPE, a kernel each for the queries and keys
        reading and writing them (2 dt per element; the s x d cos/sin table is small), and back."""
        sh = self.sh
        if not sh.rope:
            return [], []
        dt, kv = sh.dtype_bytes, sh.kv_hidden or sh.queries
        queries = self.elementwise("RoPE Q", self._tokens * sh.queries / sh.tp, 2 * dt, 2 * dt)
        keys = self.elementwise("RoPE K", self._tokens * kv / sh.tp, 2 * dt, 2 * dt)
        return queries[0] + keys[0], keys[1] + queries[1]

    def _qk_norm(self) -> Pair:
        """The query and key norms (Megatron-Core's q_layernorm and k_layernorm, Transformer Engine's
        RMSNorm over each head): one kernel over this rank's queries and keys, read and write (2 dt),
        backward read x and dy, write dx (3 dt), as the layernorm."""
        sh = self.sh
        if not sh.qk_norm:
            return [], []
        elements = self._tokens * (sh.queries + (sh.kv_hidden or sh.queries)) / sh.tp
        dt = sh.dtype_bytes
        return self.elementwise("QK norm", elements, 2 * dt, 3 * dt)

    def attn(self) -> ItemKernels:
        sh = self.sh
        core = self.attention_core()
        joined = self.join(
            self._norm(self._norm_tokens),
            self._linear("QKV", self._tokens, (sh.queries + 2 * (sh.kv_hidden or sh.queries)) // sh.tp, sh.hidden),
            self._qk_norm(),
            self._rope(),
            core,
            self._linear("attention projection", self._tokens, sh.hidden, sh.queries // sh.tp),
            self._dropout_add(self._norm_tokens),
        )
        return ItemKernels(joined.forward, joined.backward, tuple(core[0]))

    def _activation(self, rows: float, width: int) -> Pair:
        """GeLU (read x, write y: 2 dt; backward read x and dy, write dx: 3 dt) or SwiGLU over
        (rows x width) outputs (read gate and up, write y: 3 dt; backward read gate, up and dy,
        write both gradients: 5 dt)."""
        dt = self.sh.dtype_bytes
        if self.sh.gated_mlp:
            return self.elementwise("SwiGLU", rows * width, 3 * dt, 5 * dt)
        return self.elementwise("GeLU", rows * width, 2 * dt, 3 * dt)

    def mlp(self) -> ItemKernels:
        sh = self.sh
        width = sh.ffn // sh.tp
        up = 2 * width if sh.gated_mlp else width
        return self.join(
            self._norm(self._norm_tokens),
            self._linear("FC1", self._tokens, up, sh.hidden),
            self._activation(self._tokens, width),
            self._linear("FC2", self._tokens, sh.hidden, width),
            self._dropout_add(self._norm_tokens),
        )

    def embed(self) -> ItemKernels:
        """Token and position rows read, their sum written (3 dt; with rope no position rows: 2 dt);
        the weight gradient scatters dy into the fp32 gradient rows (read dy, read and write 4 + 4:
        dt + 8), a W-part kernel, of the V/t word rows and the s (unsplit) position rows."""
        sh = self.sh
        dt, elements = sh.dtype_bytes, self._tokens * sh.hidden
        tables = 1 if sh.rope else 2
        forward, backward = self.elementwise("embedding", elements, (tables + 1) * dt, dt + 8, part="W")
        weights = float((sh.vocab // sh.tp + (0 if sh.rope else sh.seq_len)) * sh.hidden)
        lookup = (forward, [dataclasses.replace(backward[0], weights=weights)])
        if not sh.hidden_dropout:
            return self.join(lookup)
        return self.join(lookup, self.elementwise("embedding dropout", elements, 2 * dt + 1, 2 * dt + 1))

    def head(self) -> ItemKernels:
        sh = self.sh
        width = sh.vocab // sh.tp
        loss = self.elementwise(
            "cross-entropy", self._tokens * width, CROSS_ENTROPY_FORWARD_BYTES, CROSS_ENTROPY_BACKWARD_BYTES
        )
        return self.join(self._norm(self._norm_tokens), self.gemm_pair("logits", self._tokens, width, sh.hidden), loss)

    def _routed_rows(self) -> int:
        """Token rows this rank's experts process: R/t (sim.cost.compute.moe_routed_rows)."""
        assert self.sh.moe is not None
        return moe_routed_rows(self.sh.micro_batch, self.sh.seq_len, self.sh.moe) // self.sh.tp

    def router(self) -> ItemKernels:
        sh, moe, dt = self.sh, self.sh.moe, self.sh.dtype_bytes
        assert moe is not None
        tokens = self._tokens // sh.tp  # each tensor-parallel rank routes 1/t of the tokens
        return self.join(
            self.gemm_pair("router", tokens, moe.num_experts, sh.hidden),
            self.elementwise(
                "router softmax+top-k",
                tokens * moe.num_experts,
                ROUTER_SOFTMAX_FORWARD_BYTES,
                ROUTER_SOFTMAX_BACKWARD_BYTES,
            ),
            self.elementwise("permute", self._routed_rows() * sh.hidden, 2 * dt, 2 * dt),
        )

    def experts(self) -> ItemKernels:
        sh, moe, dt = self.sh, self.sh.moe, self.sh.dtype_bytes
        assert moe is not None
        local = moe.num_experts // sh.ep
        rows = self._routed_rows()
        per_expert = math.ceil(rows / local)  # balanced routing
        up = (2 if sh.gated_mlp else 1) * moe.expert_ffn
        parts = [
            self._linear("expert FC1", per_expert, up, sh.hidden, local),
            self._activation(rows, moe.expert_ffn),
            self._linear("expert FC2", per_expert, sh.hidden, moe.expert_ffn, local),
        ]
        if moe.shared_experts:
            tokens, width = self._tokens // sh.tp, moe.shared_experts * moe.expert_ffn
            parts += [
                self._linear("shared FC1", tokens, (2 if sh.gated_mlp else 1) * width, sh.hidden),
                self._activation(tokens, width),
                self._linear("shared FC2", tokens, sh.hidden, width),
            ]
        parts.append(self.elementwise("unpermute+combine", rows * sh.hidden, 2 * dt, 2 * dt))
        return self.join(*parts)

    def item(self, name: str) -> ItemKernels:
        """The kernels of work item `name` (one of ITEMS)."""
        if name not in ITEMS:
            raise ValueError(f"unknown work item {name!r}: one of {', '.join(ITEMS)}")
        return getattr(self, name)()
