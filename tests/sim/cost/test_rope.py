"""Rotary position embeddings (RoPE, Su et al. 2021, arXiv:2104.09864), as Llama and Nemotron have
them: no learned position table, and in every layer Transformer Engine's fused RoPE over the
queries and the keys (Megatron-Core's apply_rope_fusion: megatron/core/transformer/attention.py calls
apply_rotary_pos_emb once for the query and once for the key), each kernel reading and writing its
tensor, forward and backward."""

import dataclasses

import pytest

from clustersim.sim.cost import gemm
from clustersim.sim.cost.kernels import LayerKernels
from clustersim.sim.cost.shapes import Shapes
from clustersim.sim.cost.stages import layers_params
from clustersim.sim.scenario.chips import CHIPS
from clustersim.sim.scenario.hardware import GPUS
from clustersim.sim.scenario.loader import load_scenario_text
from clustersim.sim.scenario.presets import MODELS
from clustersim.sim.scenario.schema import ScenarioError

CHIP, GPU = CHIPS["H100-SXM"], GPUS["H100-SXM"]
# Llama 2 70B's shapes (meta-llama/Llama-2-70b-hf config.json: hidden 8192, 64 heads, 8 key-value
# heads, intermediate 28672, vocabulary 32000), tensor parallel 4 as NeMo ran it
H, HEADS, KV_HEADS, TP, S = 8192, 64, 8, 4, 4096
SHAPES = Shapes(
    micro_batch=1, seq_len=S, hidden=H, heads=HEADS, ffn=28672, vocab=32000, tp=TP, sequence_parallel=True,
    gated_mlp=True, flash_attention=True, dtype_bytes=2, kv_hidden=H // HEADS * KV_HEADS, rope=True,
)  # fmt: skip
LEARNED = dataclasses.replace(SHAPES, rope=False)


def _named(kernels, name):
    return [k for k in kernels if k.name == name]


def test_rope_turns_the_queries_and_the_keys_once_each_way():
    rope, learned = LayerKernels(CHIP, GPU, SHAPES).attn(), LayerKernels(CHIP, GPU, LEARNED).attn()
    tokens = S  # one sequence
    widths = {"RoPE Q": H // TP, "RoPE K": H // HEADS * KV_HEADS // TP}  # 2048 query and 256 key columns a rank
    for name, width in widths.items():
        bytes_each_way = tokens * width * (2 + 2)  # read and write bf16
        (forward,) = _named(rope.forward, name)
        (backward,) = _named(rope.backward, f"{name} backward")
        assert forward.time_s == backward.time_s == gemm.elementwise_time_s(CHIP, GPU, bytes_each_way)
        assert forward.flops == backward.flops == 0.0
    assert [k.name for k in rope.forward if k.name not in widths] == [k.name for k in learned.forward]
    assert len(rope.backward) == len(learned.backward) + 2


def test_rope_sits_between_the_qkv_gemm_and_the_attention_core():
    names = [k.name for k in LayerKernels(CHIP, GPU, SHAPES).attn().forward]
    assert names.index("QKV") < names.index("RoPE Q") < names.index("RoPE K") < names.index("flash attention")
    back = [k.name for k in LayerKernels(CHIP, GPU, SHAPES).attn().backward]
    assert back.index("flash attention backward") < back.index("RoPE K backward") < back.index("QKV dgrad")


def test_no_position_table_to_read_or_to_learn():
    rope, learned = LayerKernels(CHIP, GPU, SHAPES).embed(), LayerKernels(CHIP, GPU, LEARNED).embed()
    lookup_bytes = S * H * 2  # T x h: read the token rows, write the sum (and the position rows)
    assert _named(rope.forward, "embedding")[0].time_s == gemm.elementwise_time_s(CHIP, GPU, 2 * lookup_bytes)
    assert _named(learned.forward, "embedding")[0].time_s == gemm.elementwise_time_s(CHIP, GPU, 3 * lookup_bytes)
    assert _named(rope.backward, "embedding backward")[0].weights == 32000 // TP * H
    assert _named(learned.backward, "embedding backward")[0].weights == (32000 // TP + S) * H


SCENARIO = """
name: rope
cluster:
  gpu: H100-SXM
  nodes: 1
  gpus_per_node: 8
  topology: {{kind: switch, link_bandwidth: 450GB/s, link_latency: 1us}}
model: {{layers: 4, hidden: 1024, heads: 16, ffn: 4096, seq_len: 2048, vocab: 32000{extra}}}
training: {{global_batch: 8, micro_batch: 1, dtype: bf16}}
parallel: {{tp: 2, pp: 1, dp: 4}}
numerics: {{enabled: false}}
"""


def test_the_first_stage_holds_no_position_table():
    learned = load_scenario_text(SCENARIO.format(extra=""))
    rope = load_scenario_text(SCENARIO.format(extra=", position_embedding: rope"))
    assert learned.model_spec.position_embedding == "learned"
    difference = layers_params(learned, range(4), True, True) - layers_params(rope, range(4), True, True)
    assert difference == 2048 * 1024 / 2  # seq_len x h, split over tp 2 as every embedding is


def test_llama_presets_have_rope_and_gpt_presets_a_table():
    assert {name: spec.position_embedding for name, spec in MODELS.items()} == {
        "gpt3-1.3b": "learned",
        "gpt3-175b": "learned",
        "llama2-7b": "rope",
        "llama2-13b": "rope",
        "tiny-8l": "learned",
        "mixtral-8x7b": "rope",
        "deepseek-v3-like": "rope",
        "qwen3-30b-a3b": "rope",  # the Qwen3 report, section 2: RoPE
    }


def test_an_unknown_position_embedding_names_the_field():
    with pytest.raises(ScenarioError, match=r"model\.position_embedding.*learned.*rope"):
        load_scenario_text(SCENARIO.format(extra=", position_embedding: alibi"))
