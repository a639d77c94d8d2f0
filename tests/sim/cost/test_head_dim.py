"""Attention heads whose width is not hidden / heads (model.head_dim; Qwen3: 32 heads of 128 at
hidden 2048) and the norms over each query and key head (model.qk_norm): FLOPs, parameters against
the model card, kernels, activations and the scenario's rules."""

import dataclasses
import math

import pytest

from clustersim.sim.cost import compute as cost
from clustersim.sim.cost.kernels import LayerKernels
from clustersim.sim.cost.memory import activation_bytes_per_layer
from clustersim.sim.cost.shapes import Shapes
from clustersim.sim.scenario.chips import CHIPS
from clustersim.sim.scenario.hardware import GPUS
from clustersim.sim.scenario.loader import load_scenario_text
from clustersim.sim.scenario.presets import MODELS
from clustersim.sim.scenario.schema import ScenarioError

# Qwen3-30B-A3B (sim.scenario.presets): hidden 2048, 32 query heads and 4 key-value heads of 128
H, HEADS, KV_HEADS, D = 2048, 32, 4, 128
H_Q, H_KV = HEADS * D, KV_HEADS * D  # 4096, 512


def test_attention_flops_follow_the_heads_width_not_the_hidden_size():
    """q_proj h x h_q, k_proj and v_proj h x h_kv, scores and x V over h_q, o_proj h_q x h."""
    b, s = 1, 4096
    assert cost.attention_forward_flops(b, s, H, H_KV, H_Q) == (
        2 * b * s * H * (H_Q + 2 * H_KV) + 4 * b * s * s * H_Q + 2 * b * s * H_Q * H
    )
    # heads of hidden / heads: the same as leaving the width out
    assert cost.attention_forward_flops(b, s, H, H_KV, H) == cost.attention_forward_flops(b, s, H, H_KV)
    assert cost.recompute_flops(b, s, H, 768, True, "selective", h_q=H_Q) == 4.0 * b * s * s * H_Q


def test_attention_weights_are_the_checkpoints():
    """q_proj 2048 x 4096, k_proj and v_proj 2048 x 512, o_proj 4096 x 2048: 18,874,368 weights
    (clustersim's layers also carry biases, which Qwen3's have not)."""
    biases = (H_Q + 2 * H_KV) + H
    assert cost.attention_params(H, H_KV, H_Q) - biases == 2048 * 4096 * 2 + 2048 * 512 * 2 == 18_874_368


def test_qwen3_30b_a3b_counts_what_its_model_card_says():
    """huggingface.co/Qwen/Qwen3-30B-A3B: "Number of Parameters: 30.5B in total and 3.3B activated",
    "Number of Paramaters (Non-Embedding): 29.9B" (untied embedding and LM head, final norm): our
    30.53, 3.35 and 29.91 billion, cut to the card's one decimal."""
    m = MODELS["qwen3-30b-a3b"]
    embeddings = 2 * m.vocab * m.hidden
    layers = sum(cost.model_layer_params(m, i) for i in range(m.layers)) + m.hidden
    active = sum(cost.model_layer_active_params(m, i) for i in range(m.layers)) + m.hidden
    assert [math.floor(n / 1e8) / 10 for n in (layers + embeddings, active + embeddings, layers)] == [30.5, 3.3, 29.9]
    # the query and key norms: a weight per element of one head each, in every layer
    plain = dataclasses.replace(m, qk_norm=False)
    assert cost.model_layer_params(m, 0) - cost.model_layer_params(plain, 0) == 2 * D


def _shapes(**changes) -> Shapes:
    base = Shapes(
        micro_batch=1, seq_len=4096, hidden=H, heads=HEADS, ffn=6144, vocab=151936, tp=2,
        sequence_parallel=True, gated_mlp=True, flash_attention=True, dtype_bytes=2, kv_hidden=H_KV,
        rope=True, q_hidden=H_Q,
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize("flash", [False, True])
def test_the_kernels_count_the_same_flops_at_their_shapes(flash):
    sh = _shapes(flash_attention=flash)
    layer = LayerKernels(CHIPS["H100-SXM"], GPUS["H100-SXM"], sh)
    forward = layer.attn().forward
    assert sum(k.flops for k in forward) * sh.tp == pytest.approx(
        cost.attention_forward_flops(1, 4096, H, H_KV, H_Q), rel=1e-12
    )
    qkv = next(k for k in forward if k.name == "QKV")
    assert qkv.flops == 2 * 4096 * H * (H_Q + 2 * H_KV) / sh.tp


def test_the_query_and_key_norms_are_one_pass_over_the_rank_s_queries_and_keys():
    """Read and write each element (2 x 2 bytes) forward, read two and write one backward."""
    sh = _shapes(qk_norm=True)
    chip, gpu = CHIPS["H100-SXM"], GPUS["H100-SXM"]
    with_norms, without = LayerKernels(chip, gpu, sh).attn(), LayerKernels(chip, gpu, _shapes()).attn()
    extra = [k for k in with_norms.forward if k not in without.forward]
    assert [k.name for k in extra] == ["QK norm"]
    elements = 4096 * (H_Q + H_KV) / sh.tp
    assert extra[0].time_s == pytest.approx(
        chip.launch_overhead_s + elements * 4 / (gpu.hbm_bandwidth_Bps * chip.hbm_efficiency)
    )
    assert len(with_norms.backward) == len(without.backward) + 1


def test_activations_keep_queries_at_their_width_and_the_norms_inputs():
    s, b, t = 4096, 1, 1
    kw = dict(h_kv=H_KV, f=768, gated_mlp=True, flash=True)
    wide = activation_bytes_per_layer(s, b, H, HEADS, t, h_q=H_Q, **kw)
    narrow = activation_bytes_per_layer(s, b, H, HEADS, t, **kw)
    assert wide - narrow == 2 * s * b * (H_Q - H) * 2  # Q and the projection's input, 2 bytes each
    normed = activation_bytes_per_layer(s, b, H, HEADS, t, h_q=H_Q, qk_norm=True, **kw)
    assert normed - wide == 2 * s * b * (H_Q + H_KV)


SCENARIO = """\
name: heads
cluster:
  gpu: H100-SXM
  gpus_per_node: 2
  topology: {kind: switch, link_bandwidth: 450GB/s, link_latency: 1us}
model: {layers: 2, hidden: 1000, heads: 16, head_dim: 128, ffn: 4000, seq_len: 256, vocab: 1000}
training: {global_batch: 2, micro_batch: 1}
parallel: {tp: 2}
schedule: 1f1b
"""


def test_a_head_width_frees_the_hidden_size_from_the_head_count():
    spec = load_scenario_text(SCENARIO).model_spec
    assert (spec.q_hidden, spec.kv_hidden, spec.head_width) == (2048, 2048, 128)
    with pytest.raises(ScenarioError, match="model.heads: 16 does not divide model.hidden .*give model.head_dim"):
        load_scenario_text(SCENARIO.replace(" head_dim: 128,", ""))
