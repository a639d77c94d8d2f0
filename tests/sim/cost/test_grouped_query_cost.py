"""Grouped-query attention (Ainslie et al. 2023, arXiv:2305.13245): g key-value heads of width d
serve the a query heads in groups, so the K and V projections are h x g d instead of h x h and
the attention core is unchanged. FLOPs, parameters, kernels, activations and the scenario's rules."""

import dataclasses

import pytest

from clustersim.sim.cost import compute as cost
from clustersim.sim.cost.kernels import LayerKernels
from clustersim.sim.cost.memory import activation_bytes_per_layer
from clustersim.sim.cost.shapes import Shapes
from clustersim.sim.scenario.chips import CHIPS
from clustersim.sim.scenario.hardware import GPUS
from clustersim.sim.scenario.loader import load_scenario_text
from clustersim.sim.scenario.schema import ScenarioError

# Llama 3 8B (meta-llama/Meta-Llama-3-8B, config.json): hidden 4096, 32 heads, 8 key-value heads
H, HEADS, KV_HEADS = 4096, 32, 8
H_KV = H // HEADS * KV_HEADS  # 1024


def test_qkv_flops_shrink_to_the_key_value_width():
    b, s = 2, 8192
    assert (
        cost.attention_forward_flops(b, s, H, H_KV)
        == 2 * b * s * H * (H + 2 * H_KV) + 4 * b * s * s * H + 2 * b * s * H * H
    )
    assert (
        cost.attention_forward_flops(b, s, H, H)
        == cost.attention_forward_flops(b, s, H)
        == 8 * b * s * H * H + 4 * b * s * s * H
    )


def test_attention_weights_are_llama3_8bs():
    """q_proj 4096 x 4096, k_proj and v_proj 4096 x 1024, o_proj 4096 x 4096 (the checkpoint's
    shapes): 41,943,040 weights per layer; clustersim's layers also carry biases (q k v and o)."""
    biases = (H + 2 * H_KV) + H
    assert cost.attention_params(H, H_KV) - biases == 4096 * 4096 * 2 + 4096 * 1024 * 2 == 41_943_040


@pytest.mark.parametrize("flash", [False, True])
def test_the_kernels_count_the_same_flops(flash):
    sh = Shapes(
        micro_batch=1, seq_len=8192, hidden=H, heads=HEADS, ffn=14336, vocab=128256, tp=8,
        sequence_parallel=True, gated_mlp=True, flash_attention=flash, dtype_bytes=2, kv_hidden=H_KV,
    )  # fmt: skip
    layer = LayerKernels(CHIPS["H100-SXM"], GPUS["H100-SXM"], sh)
    forward = sum(k.flops for k in layer.attn().forward)
    assert forward * sh.tp == pytest.approx(cost.attention_forward_flops(1, 8192, H, H_KV), rel=1e-12)
    mha = LayerKernels(CHIPS["H100-SXM"], GPUS["H100-SXM"], dataclasses.replace(sh, kv_hidden=None))
    assert forward < sum(k.flops for k in mha.attn().forward)


def test_activations_keep_keys_and_values_at_their_width():
    """Korthikanti et al.'s attention keeps Q and K for Q K^T (4sbh) and V (2sbh): with g key-value
    heads K and V are 2sb h_kv each, 4sb(h - h_kv) less, split by t with the heads."""
    s, b, t = 8192, 1, 8
    for sp in (False, True):
        full = activation_bytes_per_layer(s, b, H, HEADS, t, sp, "selective")
        grouped = activation_bytes_per_layer(s, b, H, HEADS, t, sp, "selective", h_kv=H_KV)
        assert full - grouped == pytest.approx(4 * s * b * (H - H_KV) / t, rel=1e-12)


SCENARIO = """
name: gqa
cluster:
  gpu: H100-SXM
  nodes: 1
  gpus_per_node: 8
  topology: {{kind: switch, link_bandwidth: 450GB/s, link_latency: 1us}}
model: {{layers: 4, hidden: 4096, heads: 32, kv_heads: {kv}, ffn: 14336, gated_mlp: true, seq_len: 8192, vocab: 128256}}
training: {{global_batch: 8, micro_batch: 1, dtype: bf16}}
parallel: {{tp: {tp}, pp: 1, dp: {dp}}}
numerics: {{enabled: false}}
"""


def test_a_scenario_says_kv_heads_and_its_rules_are_checked():
    scenario = load_scenario_text(SCENARIO.format(kv=8, tp=8, dp=1))
    assert scenario.model_spec.kv_hidden == H_KV
    with pytest.raises(ScenarioError, match=r"model\.kv_heads.*does not divide model\.heads"):
        load_scenario_text(SCENARIO.format(kv=6, tp=8, dp=1))
    with pytest.raises(ScenarioError, match=r"parallel\.tp.*does not divide model\.kv_heads"):
        load_scenario_text(SCENARIO.format(kv=4, tp=8, dp=1))
