"""Model presets as data, each with its source. A scenario names one and may override any field.

Decoder-only transformers, described by the few numbers the cost model and the memory model
need. `ffn` is the dense MLP's inner width; `gated_mlp` means a SwiGLU-style MLP with three
weight matrices (gate, up: h -> ffn; down: ffn -> h) instead of two. Attention is standard
multi-head attention with h x h Q, K, V and output projections: grouped-query attention (GQA)
and DeepSeek's multi-head latent attention (MLA) are not modelled, so presets of such models
count more attention weights than the real model (each preset's note says by how much).
`position_embedding`: GPT's learned table (seq_len x h, added to the token rows), or rotary
embeddings (RoPE, Su et al. 2021, arXiv:2104.09864) turning each layer's queries and keys, as Llama 2
("rotary positional embeddings", Touvron et al. 2023, section 2.2), Mixtral and DeepSeek-V3 have
them: no table, one more element-wise pass over the queries and keys per layer.

Mixture-of-Experts (`moe`, a `MoESpec`; None for a dense model): in an MoE layer the MLP is
replaced by `num_experts` routed experts, each an MLP of width `expert_ffn` (gated like the
dense MLP), of which a router (an h x num_experts matrix, no bias) picks `top_k` per token, plus
`shared_experts` always-on experts of the same width (DeepSeekMoE). Layer i (0-based) is an MoE
layer when i >= first_dense and i % every == every - 1 (every 2: layers 1, 3, 5, ...;
first_dense 3: DeepSeek-V3's three dense layers first); the other layers keep the dense MLP of
width `ffn`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class MoESpec:
    """The MoE MLP of a `ModelSpec` (module docstring). `capacity_factor` None: no token is dropped
    (dropless); c > 0: every expert takes at most ceil(c x T x top_k / num_experts) of a group's T
    tokens (sim.numerics.moe's rule) and its buffer is that size. `expert_groups` G and
    `limited_groups` M: the experts in G equal blocks (DeepSeek-V3: one per node of the expert-
    parallel group), each token's top_k chosen within its M best blocks (node-limited routing,
    sim.numerics.moe); M None: no limit."""

    num_experts: int
    top_k: int
    expert_ffn: int
    capacity_factor: float | None = None
    every: int = 1
    first_dense: int = 0
    shared_experts: int = 0
    expert_groups: int = 1
    limited_groups: int | None = None

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer i (0-based) has the MoE MLP: i >= first_dense and i % every == every - 1."""
        return i >= self.first_dense and i % self.every == self.every - 1

    def moe_layers(self, layers: int) -> tuple[int, ...]:
        """The MoE layers' indices among `layers` layers."""
        return tuple(range(self._first_moe_layer(), layers, self.every))

    def num_moe_layers(self, layers: int) -> int:
        """How many of `layers` layers are MoE layers (closed form: no loop over the layers)."""
        return len(range(self._first_moe_layer(), layers, self.every))

    def _first_moe_layer(self) -> int:
        """The smallest i >= first_dense with i % every == every - 1."""
        return self.first_dense + (self.every - 1 - self.first_dense) % self.every


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer. All sizes are element counts, not bytes."""

    layers: int
    hidden: int
    heads: int
    ffn: int
    seq_len: int
    vocab: int
    gated_mlp: bool = False
    moe: MoESpec | None = None
    kv_heads: int | None = None  # grouped-query attention: heads sharing keys and values in groups; None: one each
    position_embedding: str = "learned"  # "learned": a table of seq_len rows added to the tokens (GPT); "rope": rotary
    head_dim: int | None = None  # each attention head's width, where it is not hidden / heads (Qwen3); None: that
    qk_norm: bool = False  # an RMSNorm over each query and key head before attention (Qwen3's qk_layernorm)
    # Dropout probabilities, Megatron-LM's --hidden-dropout (after the attention and MLP blocks and
    # the embedding) and --attention-dropout (over the attention scores), 0.1 by default there. At
    # 0.0 PyTorch's dropout returns its input: no mask kept, no dropout kernel run.
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1

    @property
    def head_width(self) -> int:
        """Each attention head's width: head_dim, or hidden / heads."""
        return self.head_dim or self.hidden // self.heads

    @property
    def q_hidden(self) -> int:
        """The width of the queries (and of the attention's output): heads x head_width, hidden by default."""
        return self.heads * self.head_width

    @property
    def kv_hidden(self) -> int:
        """The width of the keys (and of the values): kv_heads heads of head_width."""
        return self.head_width * (self.kv_heads or self.heads)


# What the Llama 2 models share (Touvron et al. 2023, section 2.2 and Table 1): context 4096, the
# 32000-token vocabulary, SwiGLU MLPs and rotary position embeddings.
# No dropout: meta-llama/Llama-2-7b-hf config.json attention_dropout 0.0 (the Hugging Face model has
# no other), and NeMo's recipes train them with hidden_dropout and attention_dropout 0.0
# (NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/training/llama/llama2_7b.yaml).
_llama2 = functools.partial(
    ModelSpec,
    seq_len=4096,
    vocab=32000,
    gated_mlp=True,
    position_embedding="rope",
    hidden_dropout=0.0,
    attention_dropout=0.0,
)


MODELS: dict[str, ModelSpec] = {
    # GPT-3 XL, Brown et al. 2020, "Language Models are Few-Shot Learners" (arXiv:2005.14165),
    # Table 2.1: 24 layers, d_model 2048, ffn 4 x d_model, context 2048, GPT-2 BPE vocab 50257.
    # The table's n_heads 24 x d_head 128 != 2048 is a known typo; we use 16 heads of 128, as
    # Megatron-LM's and GPT-Neo's 1.3B configs do.
    "gpt3-1.3b": ModelSpec(layers=24, hidden=2048, heads=16, ffn=8192, seq_len=2048, vocab=50257),
    # GPT-3 175B, same paper, Table 2.1: 96 layers, d_model 12288, 96 heads of 128, ffn 4 x d_model.
    "gpt3-175b": ModelSpec(layers=96, hidden=12288, heads=96, ffn=49152, seq_len=2048, vocab=50257),
    # Llama 2 7B, Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models"
    # (arXiv:2307.09288), Table 1 (context 4096); dims from meta-llama/Llama-2-7b-hf config.json:
    # hidden_size 4096, num_hidden_layers 32, num_attention_heads 32, intermediate_size 11008,
    # vocab_size 32000; SwiGLU MLP.
    "llama2-7b": _llama2(layers=32, hidden=4096, heads=32, ffn=11008),
    # Llama 2 13B, same paper; meta-llama/Llama-2-13b-hf config.json: hidden_size 5120,
    # num_hidden_layers 40, num_attention_heads 40, intermediate_size 13824, vocab_size 32000.
    "llama2-13b": _llama2(layers=40, hidden=5120, heads=40, ffn=13824),
    # Not a published model: a small GPT-style shape for quick scenarios and tests
    # (8 layers split evenly by pp 1, 2, 4, 8; 16 heads split by tp 1..16).
    "tiny-8l": ModelSpec(layers=8, hidden=1024, heads=16, ffn=4096, seq_len=1024, vocab=32000),
    # Mixtral 8x7B, Jiang et al. 2024, "Mixtral of Experts" (arXiv:2401.04088), Table 1: dim 4096,
    # 32 layers, 32 heads of 128, 8 KV heads, hidden_dim 14336, context 32768, vocab 32000, 8 experts,
    # top 2, SwiGLU experts, every layer MoE; mistralai/Mixtral-8x7B-v0.1 config.json agrees
    # (num_local_experts 8, num_experts_per_tok 2, intermediate_size 14336, max_position_embeddings
    # 32768). seq_len is the paper's 32k training context ("trained with a context size of 32k
    # tokens"); override it (e.g. 4096) for cheaper runs (training.flash_attention drops the
    # 5as^2b score term from the memory). With its 8 key-value heads we count 46.7B parameters and
    # 12.9B active, as Mistral AI publishes them (tests/sim/cost/test_cost_moe.py).
    "mixtral-8x7b": ModelSpec(
        layers=32,
        hidden=4096,
        heads=32,
        ffn=14336,
        seq_len=32768,
        vocab=32000,
        gated_mlp=True,
        position_embedding="rope",
        kv_heads=8,
        moe=MoESpec(num_experts=8, top_k=2, expert_ffn=14336),
        hidden_dropout=0.0,  # config.json attention_dropout 0.0; the Hugging Face model has no other dropout
        attention_dropout=0.0,
    ),
    # DeepSeek-V3-like, DeepSeek-AI 2024, "DeepSeek-V3 Technical Report" (arXiv:2412.19437), section
    # 4.2: 61 layers, hidden 7168, 128 attention heads, all FFNs but the first three layers' are MoE
    # layers of 1 shared + 256 routed experts of width 2048, 8 routed experts per token, pre-training
    # sequence length 4K; deepseek-ai/DeepSeek-V3 config.json: intermediate_size 18432 (the dense layers),
    # moe_intermediate_size 2048, first_k_dense_replace 3, vocab_size 129280, SiLU (SwiGLU) MLPs.
    # "-like": MLA (low-rank compressed Q and KV, 128 heads of 128 + 64 rope dims) is approximated
    # by standard MHA with 128 heads of 7168 / 128 = 56: its 4h^2 = 205.5M weights per layer are
    # 18.4M more than MLA's 187.1M (1.1B over 61 layers), and its scores and x V FLOPs, 4bs^2h with
    # h = 7168, are fewer than MLA's 2bs^2 x 128 x (192 + 128); node-limited routing is (8 groups,
    # 4 per token); sigmoid scores, the bias's updates and multi-token prediction are not modelled.
    # We count 672.3B total and 37.8B active (without the embedding lookup) against the paper's
    # 671B and 37B. 61 layers is prime: with parallel.pp other than 1 or 61, parallel.stage_layers
    # splits them unevenly (the report's run had 16 pipeline stages, section 3.2).
    "deepseek-v3-like": ModelSpec(
        layers=61,
        hidden=7168,
        heads=128,
        ffn=18432,
        seq_len=4096,
        vocab=129280,
        gated_mlp=True,
        position_embedding="rope",
        moe=MoESpec(
            num_experts=256,
            top_k=8,
            expert_ffn=2048,
            first_dense=3,
            shared_experts=1,
            expert_groups=8,  # inference/configs/config_671B.json: n_expert_groups 8,
            limited_groups=4,  # n_limited_groups 4 (a token's experts on at most 4 of 8 nodes)
        ),
        hidden_dropout=0.0,  # config.json attention_dropout 0.0; the Hugging Face model has no other dropout
        attention_dropout=0.0,
    ),
    # Qwen3-30B-A3B, Qwen Team 2025, "Qwen3 Technical Report" (arXiv:2505.09388), Table 2: 48 layers,
    # 32 query and 4 key-value heads, 128 experts of which 8 per token; the Hugging Face checkpoint's
    # shapes as Megatron-LM arguments (THUDM/slime scripts/models/qwen3-30B-A3B.sh): hidden 2048,
    # kv-channels 128 (heads of 128, not 2048 / 32), moe-ffn-hidden-size 768 (SwiGLU experts), every
    # layer MoE, qk-layernorm, RMSNorm, RoPE, untied embeddings, vocab 151936. seq_len is the report's
    # first pre-training stage's 4,096 tokens (section 3.2). We count 30.5B parameters, 3.3B active per
    # token and 29.9B outside the embeddings, as the model card (huggingface.co/Qwen/Qwen3-30B-A3B)
    # gives them (tests/sim/cost/test_head_dim.py).
    "qwen3-30b-a3b": ModelSpec(
        layers=48,
        hidden=2048,
        heads=32,
        ffn=6144,
        seq_len=4096,
        vocab=151936,
        gated_mlp=True,
        position_embedding="rope",
        kv_heads=4,
        head_dim=128,
        qk_norm=True,
        moe=MoESpec(num_experts=128, top_k=8, expert_ffn=768),
        # config.json attention_dropout 0.0; Megatron-Bridge's Qwen3 MoE provider sets hidden_dropout 0.0
        # (src/megatron/bridge/models/qwen/qwen3_moe_bridge.py)
        hidden_dropout=0.0,
        attention_dropout=0.0,
    ),
}
