"""Model presets as data, each with its source. A scenario names one and may override any field.

Dense decoder-only transformers, described by the few numbers the cost model and the memory
model need. `ffn` is the MLP's inner width; `gated_mlp` means a SwiGLU-style MLP with three
weight matrices (gate, up: h -> ffn; down: ffn -> h) instead of two.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    "llama2-7b": ModelSpec(
        layers=32, hidden=4096, heads=32, ffn=11008, seq_len=4096, vocab=32000, gated_mlp=True
    ),
    # Llama 2 13B, same paper; meta-llama/Llama-2-13b-hf config.json: hidden_size 5120,
    # num_hidden_layers 40, num_attention_heads 40, intermediate_size 13824, vocab_size 32000.
    "llama2-13b": ModelSpec(
        layers=40, hidden=5120, heads=40, ffn=13824, seq_len=4096, vocab=32000, gated_mlp=True
    ),
    # Not a published model: a small GPT-style shape for quick scenarios and tests
    # (8 layers split evenly by pp 1, 2, 4, 8; 16 heads split by tp 1..16).
    "tiny-8l": ModelSpec(layers=8, hidden=1024, heads=16, ffn=4096, seq_len=1024, vocab=32000),
}
