"""What one tensor-parallel rank's kernels are made of (sim.cost.kernels): the model's shapes as
that rank sees them, under the scenario's parallelism and precision."""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.sim.scenario.presets import MoESpec


@dataclass(frozen=True)
class Shapes:
    """What one tensor-parallel rank's kernels are made of."""

    micro_batch: int
    seq_len: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    tp: int
    sequence_parallel: bool
    gated_mlp: bool
    flash_attention: bool
    dtype_bytes: int
    moe: MoESpec | None = None
    ep: int = 1
    fp8: bool = False  # the transformer layers' linear GEMMs in FP8 (Transformer Engine)
    kv_hidden: int | None = None  # the keys' and values' width under grouped-query attention (None: hidden)
    fp32_weight_gradients: bool = False  # weight-gradient GEMMs add into an FP32 buffer (kernel_times)
    rope: bool = False  # rotary position embeddings on the queries and keys; False: a learned position table
    q_hidden: int | None = None  # the queries' width where heads are not hidden / heads wide (None: hidden)
    qk_norm: bool = False  # an RMSNorm over each query and key head (Qwen3)
    hidden_dropout: bool = True  # dropout (a mask kernel) after each block and the embedding; False: p = 0
    attention_dropout: bool = True  # dropout over the unfused core's probabilities; False: p = 0

    @property
    def queries(self) -> int:
        """The queries' (and the attention output's) width: heads x head_width."""
        return self.q_hidden or self.hidden

    @property
    def head_width(self) -> int:
        return self.queries // self.heads
