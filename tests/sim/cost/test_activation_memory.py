"""Activations beyond Korthikanti et al.'s GPT layer, each against a hand count of the tensors kept
for the backward: a SwiGLU MLP of any width, flash attention, the LM head and the embedding; and
the NeMo calibration runs, which fit an H100 in NeMo's own measurements, fit here too."""

import pytest

from clustersim.sim.cost.memory import (
    activation_bytes_per_layer,
    embedding_activation_bytes,
    head_activation_bytes,
    model_state_bytes,
)
from clustersim.sim.cost.stages import stage_params
from clustersim.sim.plan.estimate import memory_peak_bytes
from clustersim.sim.scenario.loader import load_scenario

from repo import SCENARIOS


def layer_tensors(s, b, h, a, f, gated):
    """(bytes, split by tensor parallelism even without sequence parallelism) of each tensor a layer keeps,
    listed one by one after Korthikanti et al. section 4.1, with the MLP's width f and SwiGLU's
    FC1 output 2f wide (both halves feed the activation's backward)."""
    sbh, core = s * b * h, a * s * s * b
    return {
        "input layernorm's input": (2 * sbh, False),
        "QKV GEMM's input": (2 * sbh, False),
        "Q": (2 * sbh, True),
        "K": (2 * sbh, True),
        "V": (2 * sbh, True),
        "softmax output": (2 * core, True),
        "softmax dropout mask": (core, True),
        "softmax dropout output": (2 * core, True),
        "projection's input": (2 * sbh, True),
        "attention dropout mask": (sbh, False),
        "post-attention layernorm's input": (2 * sbh, False),
        "FC1's input": (2 * sbh, False),
        "activation's input (FC1's output)": (2 * s * b * (2 * f if gated else f), True),
        "FC2's input": (2 * s * b * f, True),
        "MLP dropout mask": (sbh, False),
    }


def kept(tensors, t, sp):
    return sum(nbytes / (t if split or sp else 1) for nbytes, split in tensors.values())


LLAMA2_7B = {"s": 4096, "b": 1, "h": 4096, "a": 32}  # meta-llama/Llama-2-7b-hf config.json
LLAMA2_7B_FFN = 11008


@pytest.mark.parametrize("t, sp", [(1, False), (4, False), (4, True)])
def test_swiglu_layer_keeps_what_a_hand_count_lists(t, sp):
    tensors = layer_tensors(**LLAMA2_7B, f=LLAMA2_7B_FFN, gated=True)
    got = activation_bytes_per_layer(**LLAMA2_7B, t=t, sp=sp, f=LLAMA2_7B_FFN, gated_mlp=True)
    assert got == pytest.approx(kept(tensors, t, sp), rel=1e-12)
    if t == 1:  # 34.125 sbh + 5as^2b: the MLP keeps 3sbh + 6sbf, 6 x 11008 / 4096 = 16.125 sbh
        sbh = 4096 * 4096
        assert got == 34.125 * sbh + 5 * 32 * 4096 * 4096


def test_swiglu_at_two_thirds_of_4h_keeps_what_the_gelu_mlp_does():
    """Shazeer 2020 (arXiv:2002.05202, section 2) shrinks a GLU MLP's width to 2/3 x 4h to keep its
    parameters; its activations (6 sbf = 16 sbh) then equal the GeLU MLP's (4 sbf = 16 sbh) too."""
    s, b, h, a = 2048, 2, 3072, 24
    gelu = activation_bytes_per_layer(s, b, h, a, t=2)
    assert activation_bytes_per_layer(s, b, h, a, t=2, f=8 * h // 3, gated_mlp=True) == pytest.approx(gelu)
    assert activation_bytes_per_layer(s, b, h, a, t=2, f=4 * h) == gelu  # f defaults to 4h


NEMOTRON_8B = {"s": 4096, "b": 4, "h": 4096, "a": 32}  # scenarios/calibration/nemo_nemotron_8b.yaml


def test_flash_layer_keeps_the_logsumexp_not_the_scores():
    """Nemotron-8B's layer at t = 2 with sequence parallelism: the linear tensors (34 sbh / t, the
    hand count less its s x s ones) and FlashAttention's fp32 logsumexp per (batch, head, query
    row), 4 bytes x 4 x 32 x 4096 / 2; 1.14 GB instead of the unfused layer's 6.5 GB."""
    tensors = layer_tensors(**NEMOTRON_8B, f=16384, gated=False)
    linear = {k: v for k, v in tensors.items() if not k.startswith("softmax")}
    assert kept(linear, 2, True) == 34 * 4096 * 4 * 4096 / 2
    flash = activation_bytes_per_layer(**NEMOTRON_8B, t=2, sp=True, f=16384, flash=True)
    assert flash == kept(linear, 2, True) + 4 * 4 * 32 * 4096 / 2 == 1_141_899_264
    unfused = activation_bytes_per_layer(**NEMOTRON_8B, t=2, sp=True, f=16384)
    assert unfused == kept(tensors, 2, True) == 6_509_559_808


@pytest.mark.parametrize("t, sp", [(1, False), (8, False), (8, True)])
def test_selective_recompute_with_flash_keeps_the_linear_tensors(t, sp):
    """The checkpointed core's inputs (Q, K, V) are kept anyway and its output is the projection's
    input: selective recompute drops only the logsumexp from a flash layer."""
    gpt3 = {"s": 2048, "b": 1, "h": 12288, "a": 96}
    selective = activation_bytes_per_layer(**gpt3, t=t, sp=sp, recompute="selective")
    assert activation_bytes_per_layer(**gpt3, t=t, sp=sp, recompute="selective", flash=True) == selective
    assert activation_bytes_per_layer(**gpt3, t=t, sp=sp, flash=True) == pytest.approx(
        selective + 4 * 96 * 2048 / t, rel=1e-12
    )


def test_head_keeps_megatrons_fp32_softmax_over_its_vocabulary_shard():
    """A 256k vocabulary at 16384 tokens (4 x 4096) and t = 2: the vocab-parallel cross-entropy's
    softmax is 4 bytes x 16384 x 128000 = 8.39 GB (megatron/core/tensor_parallel/cross_entropy.py
    saves exp_logits, its bool target mask and int64 masked targets); the final layernorm's and the
    head GEMM's 16-bit inputs are sequence shards, 2 x 2 x 16384 x 4096 / 2."""
    softmax = 4 * 16384 * 128000
    assert softmax == 8_388_608_000
    inputs = 2 * 2 * 16384 * 4096 / 2
    targets = 16384 * (1 + 8)
    assert head_activation_bytes(4096, 4, 4096, 256000, t=2, sp=True) == softmax + inputs + targets
    assert head_activation_bytes(4096, 4, 4096, 256000, t=2) == softmax + 2 * inputs + targets


def test_embedding_keeps_its_token_ids_and_dropout_mask():
    """int64 ids (8 B a token), the out-of-shard mask when t > 1 (1 B), the dropout mask (sbh)."""
    tokens = 4096 * 4
    assert embedding_activation_bytes(4096, 4, 4096) == 8 * tokens + tokens * 4096
    assert embedding_activation_bytes(4096, 4, 4096, t=2, sp=True) == 9 * tokens + tokens * 4096 / 2


DROPOUT_TENSORS = ("softmax dropout mask", "softmax dropout output", "attention dropout mask", "MLP dropout mask")


@pytest.mark.parametrize("t, sp", [(1, False), (8, False), (8, True)])
def test_a_layer_without_dropout_keeps_no_masks(t, sp):
    """At dropout 0 PyTorch's dropout returns its input: the hand count less the two hidden masks
    (sbh each) and, without attention dropout, less the scores' mask and dropout output, the
    context GEMM reading the softmax output itself (5as^2b becomes 2as^2b)."""
    gpt3 = {"s": 2048, "b": 1, "h": 12288, "a": 96}
    tensors = layer_tensors(**gpt3, f=4 * 12288, gated=False)
    hidden_only = {k: v for k, v in tensors.items() if k not in ("attention dropout mask", "MLP dropout mask")}
    none = {k: v for k, v in tensors.items() if k not in DROPOUT_TENSORS}
    got = activation_bytes_per_layer(**gpt3, t=t, sp=sp, hidden_dropout=False)
    assert got == pytest.approx(kept(hidden_only, t, sp), rel=1e-12)
    got = activation_bytes_per_layer(**gpt3, t=t, sp=sp, hidden_dropout=False, attention_dropout=False)
    assert got == pytest.approx(kept(none, t, sp), rel=1e-12)
    if t == 1:  # Korthikanti's 34sbh + 5as^2b less 2sbh + 3as^2b
        sbh = 2048 * 12288
        assert got == 32 * sbh + 2 * 96 * 2048 * 2048
    flash = activation_bytes_per_layer(**gpt3, t=t, sp=sp, flash=True, attention_dropout=False)
    assert flash == activation_bytes_per_layer(**gpt3, t=t, sp=sp, flash=True)  # flash keeps no mask either way


def test_embedding_without_dropout_keeps_its_token_ids_only():
    tokens = 4096 * 4
    assert embedding_activation_bytes(4096, 4, 4096, dropout=False) == 8 * tokens
    assert embedding_activation_bytes(4096, 4, 4096, t=2, sp=True, dropout=False) == 9 * tokens


def test_nemotron_8b_keeps_its_layers_embedding_and_head_for_one_microbatch():
    """One stage, 1F1B: one microbatch in flight, its 32 flash layers, embedding and head (above),
    none of them with a dropout mask (NeMo trains Nemotron without dropout)."""
    scenario = load_scenario(SCENARIOS / "calibration" / "nemo_nemotron_8b.yaml")
    p = scenario.parallel
    static = sum(
        model_state_bytes(stage_params(scenario, 0), p.zero, p.dp, grad_bytes=scenario.gradient_bytes).values()
    )
    tokens = 4096 * 4
    tensors = layer_tensors(**NEMOTRON_8B, f=16384, gated=False)
    layer = kept(
        {k: v for k, v in tensors.items() if k not in DROPOUT_TENSORS and not k.startswith("softmax")}, 2, True
    )
    assert layer + 4 * 4 * 32 * 4096 / 2 == 1_141_899_264 - 2 * tokens * 4096 / 2  # the flash layer less two masks
    embedding = 9 * tokens
    head = 4 * tokens * 128000 + 2 * 2 * tokens * 4096 / 2 + 9 * tokens
    assert memory_peak_bytes(scenario) - static == pytest.approx(
        32 * (layer + 4 * 4 * 32 * 4096 / 2) + embedding + head, rel=1e-12
    )


@pytest.mark.parametrize(
    "name",
    [
        "nemo_nemotron_8b",
        "nemo_nemotron_22b",
        "nemo_llama2_7b",
        "nemo_llama2_13b",
        "nemo_llama2_70b",
        "bridge_llama3_70b",
    ],
)
def test_nemo_calibration_runs_fit_their_gpu(name):
    """NVIDIA measured each of these on DGX H100s (NeMo 24.07 and Megatron-Bridge performance
    summaries, the scenarios' sources): they ran, so they fit in 80 GB."""
    scenario = load_scenario(SCENARIOS / "calibration" / f"{name}.yaml")
    assert memory_peak_bytes(scenario) <= scenario.gpu_spec.memory_bytes
