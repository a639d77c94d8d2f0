"""sim.cost for Mixture-of-Experts models: closed forms of an MoE layer's FLOPs and parameters,
the per-layer functions agreeing with the dense ones on dense layers (dense results unchanged),
and the MoE presets' parameter totals against their published numbers."""

import math

import pytest

from clustersim.sim.cost import compute as cost
from clustersim.sim.numerics.moe import moe_param_shapes
from clustersim.sim.scenario.presets import MODELS, ModelSpec, MoESpec

DENSE = sorted(name for name, spec in MODELS.items() if spec.moe is None)
MOE = sorted(name for name, spec in MODELS.items() if spec.moe is not None)


# --- dense results unchanged ------------------------------------------------------------------


def test_dense_layer_closed_forms_are_unchanged():
    """Megatron's 24bsh^2 + 4bs^2h for f = 4h, and 12h^2 + 13h parameters (GPT-3 1.3B's shape)."""
    b, s, h = 2, 2048, 2048
    assert cost.layer_forward_flops(b, s, h, 4 * h, False) == 24 * b * s * h * h + 4 * b * s * s * h
    assert cost.layer_params(h, 4 * h, False) == 12 * h * h + 13 * h
    assert cost.layer_params(4096, 11008, True) == 4 * 4096**2 + 3 * 4096 * 11008 + 11008 + 9 * 4096


@pytest.mark.parametrize("preset", DENSE)
def test_per_layer_functions_equal_the_dense_ones_on_every_layer_of_a_dense_model(preset):
    m = MODELS[preset]
    for i in range(m.layers):
        assert cost.model_layer_params(m, i) == cost.layer_params(m.hidden, m.ffn, m.gated_mlp)
        assert cost.model_layer_active_params(m, i) == cost.model_layer_params(m, i)
        assert cost.model_layer_forward_flops(m, 3, i) == cost.layer_forward_flops(
            3, m.seq_len, m.hidden, m.ffn, m.gated_mlp
        )
        for mode in ("none", "selective", "full"):
            assert cost.model_layer_recompute_flops(m, 3, i, mode) == cost.recompute_flops(
                3, m.seq_len, m.hidden, m.ffn, m.gated_mlp, mode
            )


def test_dense_layers_of_an_moe_model_are_dense_layers():
    m = MODELS["deepseek-v3-like"]
    for i in range(3):  # first_dense
        assert cost.model_layer_params(m, i) == cost.layer_params(m.hidden, m.ffn, True)
        assert cost.model_layer_forward_flops(m, 1, i) == cost.layer_forward_flops(1, m.seq_len, m.hidden, m.ffn, True)
    assert cost.model_layer_params(m, 3) == cost.moe_layer_params(m.hidden, m.moe, True)


@pytest.mark.parametrize("i", [-1, 8])
def test_rejects_a_layer_outside_the_model(i):
    with pytest.raises(ValueError, match=r"layer -?\d+ is outside 0\.\.7"):
        cost.model_layer_params(MODELS["tiny-8l"], i)
    with pytest.raises(ValueError, match=r"outside 0\.\.7"):
        cost.model_layer_recompute_flops(MODELS["tiny-8l"], 1, i, "selective")


# --- which layers are MoE layers --------------------------------------------------------------


def test_every_n_th_layer_is_moe_after_the_first_dense_ones():
    assert MoESpec(8, 2, 64, every=2).moe_layers(8) == (1, 3, 5, 7)
    assert MoESpec(8, 2, 64, every=1).moe_layers(4) == (0, 1, 2, 3)
    assert MoESpec(8, 2, 64, every=3, first_dense=3).moe_layers(12) == (5, 8, 11)
    assert MoESpec(8, 2, 64, first_dense=3).moe_layers(61) == tuple(range(3, 61))  # DeepSeek-V3: 58


def test_moe_layer_count_closed_form_matches_the_rule():
    for every in range(1, 6):
        for first_dense in range(8):
            moe = MoESpec(4, 1, 8, every=every, first_dense=first_dense)
            for layers in range(12):
                listed = tuple(i for i in range(layers) if moe.is_moe_layer(i))
                assert moe.moe_layers(layers) == listed and moe.num_moe_layers(layers) == len(listed)


# --- an MoE layer's closed forms ----------------------------------------------------------------


@pytest.mark.parametrize("gated, m", [(False, 2), (True, 3)])
def test_dropless_moe_mlp_flops_per_token_is_router_plus_k_and_shared_experts(gated, m):
    """2h (E + f' m (k + S)) per token: h x E router logits, k routed and S shared MLPs of width f'."""
    b, s, h = 2, 16, 64
    moe = MoESpec(num_experts=16, top_k=4, expert_ffn=32, shared_experts=2)
    per_token = 2 * h * (16 + 32 * m * (4 + 2))
    assert cost.moe_mlp_forward_flops(b, s, h, moe, gated) == b * s * per_token
    assert cost.moe_routed_rows(b, s, moe) == b * s * 4


def test_capacity_pads_every_expert_to_its_buffer():
    """E ceil(c T k / E) routed rows: T = 2 x 16 = 32 tokens, k 2, E 8, c 1.25 -> 8 x ceil(10) = 80
    rows (1.25 x the dropless 64); c 0.3 -> 8 x ceil(2.4) = 24 rows."""
    b, s, h = 2, 16, 64
    dropless = MoESpec(8, 2, 32)
    assert cost.moe_routed_rows(b, s, MoESpec(8, 2, 32, capacity_factor=1.25)) == 80
    assert cost.moe_routed_rows(b, s, MoESpec(8, 2, 32, capacity_factor=0.3)) == 24
    assert cost.moe_routed_rows(b, s, MoESpec(8, 2, 32, capacity_factor=1.0)) == cost.moe_routed_rows(b, s, dropless)
    padded = cost.moe_mlp_forward_flops(b, s, h, MoESpec(8, 2, 32, capacity_factor=1.25), False)
    assert padded - cost.moe_mlp_forward_flops(b, s, h, dropless, False) == 16 * 2 * h * 32 * 2  # 16 more rows


def test_one_expert_top_1_is_the_dense_mlp_plus_a_router():
    b, s, h, f = 2, 16, 64, 256
    moe = MoESpec(num_experts=1, top_k=1, expert_ffn=f)
    for gated in (False, True):
        router = 2 * b * s * h
        assert cost.moe_mlp_forward_flops(b, s, h, moe, gated) == cost.mlp_forward_flops(b, s, h, f, gated) + router
        assert cost.moe_layer_params(h, moe, gated) == cost.layer_params(h, f, gated) + h
        spec = ModelSpec(layers=2, hidden=h, heads=4, ffn=f, seq_len=s, vocab=100, gated_mlp=gated, moe=moe)
        assert cost.model_layer_forward_flops(spec, b, 1) == cost.layer_forward_flops(b, s, h, f, gated) + router


@pytest.mark.parametrize("gated, m", [(False, 2), (True, 3)])
def test_moe_layer_params_closed_form(gated, m):
    """(E + S) experts of m h f' + f' + h, an h x E router, attention 4h^2 + 4h, layernorms 4h; a
    token uses k + S of the experts."""
    h, f, E, k, S = 64, 32, 16, 4, 2
    moe = MoESpec(num_experts=E, top_k=k, expert_ffn=f, shared_experts=S)
    expert = m * h * f + f + h
    assert cost.moe_mlp_params(h, moe, gated) == (E + S) * expert + h * E
    assert cost.moe_mlp_active_params(h, moe, gated) == (k + S) * expert + h * E
    assert cost.moe_layer_params(h, moe, gated) == 4 * h * h + 4 * h + 4 * h + (E + S) * expert + h * E
    spec = ModelSpec(layers=1, hidden=h, heads=4, ffn=128, seq_len=8, vocab=100, gated_mlp=gated, moe=moe)
    assert cost.model_layer_active_params(spec, 0) == 8 * h + 4 * h * h + (k + S) * expert + h * E


def test_moe_mlp_params_count_the_numerics_models_arrays():
    """The numpy MoE layer (sim.numerics.moe: GeLU experts with biases, a bias-free gate, one
    shared expert) holds exactly the parameters the cost model counts."""
    h, f, E = 8, 16, 4
    for shared in (False, True):
        shapes = moe_param_shapes("moe", h, f, E, shared)
        moe = MoESpec(num_experts=E, top_k=2, expert_ffn=f, shared_experts=int(shared))
        assert cost.moe_mlp_params(h, moe, False) == sum(math.prod(shape) for shape in shapes.values())


def test_full_recompute_of_an_moe_layer_is_its_forward():
    m = MODELS["mixtral-8x7b"]
    assert cost.model_layer_recompute_flops(m, 1, 0, "full") == cost.model_layer_forward_flops(m, 1, 0)
    assert cost.model_layer_recompute_flops(m, 1, 0, "selective") == 4.0 * m.seq_len**2 * m.hidden
    assert cost.model_layer_recompute_flops(m, 1, 0, "none") == 0.0


# --- presets against their sources --------------------------------------------------------------


def totals(spec: ModelSpec) -> tuple[int, int]:
    """(total, active) parameters: the layers, the token embedding, the LM head and the final
    norm. No position embedding: both models use RoPE (sim.stage_costs.stage_params adds seq_len x h
    for every model, a small overcount these checks leave out)."""
    outside = 2 * spec.vocab * spec.hidden + 2 * spec.hidden
    total = sum(cost.model_layer_params(spec, i) for i in range(spec.layers)) + outside
    active = sum(cost.model_layer_active_params(spec, i) for i in range(spec.layers)) + outside
    return total, active


def test_mixtral_shape_matches_the_paper():
    m = MODELS["mixtral-8x7b"]
    assert (m.layers, m.hidden, m.heads, m.hidden // m.heads, m.ffn, m.vocab, m.seq_len) == (
        32,
        4096,
        32,
        128,
        14336,
        32000,
        32768,
    )
    assert (m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn, m.moe.shared_experts) == (8, 2, 14336, 0)
    assert m.gated_mlp and m.moe.moe_layers(m.layers) == tuple(range(32))


def test_mixtral_parameter_totals_match_mistral_ai():
    """Mistral AI: 46.7B total, 12.9B active (the paper rounds to 47B and 13B). With its 8 key-value
    heads of 128 we are within 0.2% of both (the rest: our biases and layernorm biases, which
    Mixtral does not have)."""
    m = MODELS["mixtral-8x7b"]
    assert m.kv_heads == 8 and m.kv_hidden == 1024
    total, active = totals(m)
    assert total == pytest.approx(46.7e9, rel=0.002)
    assert active == pytest.approx(12.9e9, rel=0.002)


def test_deepseek_v3_like_shape_matches_the_report():
    m = MODELS["deepseek-v3-like"]
    assert (m.layers, m.hidden, m.heads, m.ffn, m.vocab, m.seq_len) == (61, 7168, 128, 18432, 129280, 4096)
    moe = m.moe
    assert (moe.num_experts, moe.top_k, moe.expert_ffn, moe.shared_experts, moe.first_dense) == (256, 8, 2048, 1, 3)
    assert m.gated_mlp and moe.num_moe_layers(m.layers) == 58


def test_deepseek_v3_like_parameter_totals_within_the_mla_gap():
    """The report (section 4.2): 671B total, 37B activated per token. We count 672.3B total (+0.2%)
    and 37.76B active (+2.0%) without the input embedding, a lookup that does no matmul (DeepSeek's
    README_WEIGHTS.md has said both "36.6B including the output head" and "36.7B including the
    embedding and the head"; only the first fits a straight count, so we compare without it). The
    gap is MLA: our MHA's 4h^2 = 205.5M attention weights per layer against MLA's 187.1M
    (q: 7168 x 1536 + 1536 x 128 x 192; kv: 7168 x 576 + 512 x 128 x 256; out: 128 x 128 x 7168;
    norms of 1536 and 512), 1.12B over 61 layers. Without it the total is within 0.03% of 671B and
    the active count 1.0% under 37B (0.1% over 36.6B); the rest is our biases and rounding."""
    m = MODELS["deepseek-v3-like"]
    total, active = totals(m)
    active_without_embedding = active - m.vocab * m.hidden
    assert total == pytest.approx(671e9, rel=0.005)
    assert active_without_embedding == pytest.approx(37e9, rel=0.03)
    mla = (
        7168 * 1536
        + 1536
        + 1536 * 128 * (128 + 64)
        + 7168 * (512 + 64)
        + 512
        + 512 * 128 * (128 + 128)
        + 128 * 128 * 7168
    )
    assert mla == 187_107_328
    mla_gap = m.layers * (cost.attention_params(m.hidden) - mla)
    assert mla_gap == pytest.approx(1.125e9, rel=1e-3)
    assert total - mla_gap == pytest.approx(671e9, rel=0.001)
    assert active_without_embedding - mla_gap == pytest.approx(37e9, rel=0.015)


@pytest.mark.parametrize("preset", MOE)
def test_moe_forward_flops_are_about_2_x_active_params_per_token(preset):
    """Away from attention's s^2 term, a layer's forward FLOPs per token are 2 x the parameters a
    token uses (minus biases and layernorms, which do no matmul)."""
    m = MODELS[preset]
    short = ModelSpec(**{**m.__dict__, "seq_len": 1})
    for i in (0, m.layers - 1):
        flops = cost.model_layer_forward_flops(short, 1, i) - 4 * m.hidden  # 4bs^2h at s = b = 1
        assert flops == pytest.approx(2 * cost.model_layer_active_params(m, i), rel=1e-3)
