"""Dropout that is off (model.hidden_dropout, model.attention_dropout 0, as Llama, Mixtral, Qwen3
and NeMo's Nemotron train): PyTorch's dropout then returns its input, so no mask kernel runs and
none is kept; the kernels a layer loses, counted by hand, and the scenario's rules."""

import dataclasses

import pytest

from clustersim.sim.cost import gemm
from clustersim.sim.cost.kernels import LayerKernels
from clustersim.sim.cost.shapes import Shapes
from clustersim.sim.scenario.chips import CHIPS
from clustersim.sim.scenario.hardware import GPUS
from clustersim.sim.scenario.loader import load_scenario_text
from clustersim.sim.scenario.presets import MODELS
from clustersim.sim.scenario.schema import ScenarioError

CHIP, GPU = CHIPS["A100-SXM-80GB"], GPUS["A100-SXM-80GB"]
# Korthikanti et al.'s 22B layer (h 6144, 64 heads, s 2048, micro-batch 4) at tensor parallel 8,
# unfused attention: every dropout of Megatron's GPT layer is in it.
BASE = Shapes(
    micro_batch=4, seq_len=2048, hidden=6144, heads=64, ffn=24576, vocab=51200, tp=8,
    sequence_parallel=False, gated_mlp=False, flash_attention=False, dtype_bytes=2,
)  # fmt: skip
TOKENS = 4 * 2048


def _names(kernels) -> list[str]:
    return [k.name for k in kernels]


def test_without_hidden_dropout_the_residual_add_stays_and_its_backward_goes():
    """Forward: read x and the residual, write y (3 x 2 bytes), no mask byte; backward: dy goes to
    both inputs as it is, no kernel. The embedding loses its dropout both ways."""
    on = LayerKernels(CHIP, GPU, BASE)
    off = LayerKernels(CHIP, GPU, dataclasses.replace(BASE, hidden_dropout=False))
    for item in ("attn", "mlp"):
        with_dropout, without = on.item(item), off.item(item)
        assert "dropout+residual" in _names(with_dropout.forward)
        assert "dropout+residual" not in _names(without.forward)
        add = next(k for k in without.forward if k.name == "residual add")
        assert add.time_s == pytest.approx(gemm.elementwise_time_s(CHIP, GPU, TOKENS * 6144 * 6))
        assert len(without.forward) == len(with_dropout.forward)
        assert _names(without.backward) == [
            n for n in _names(with_dropout.backward) if n != "dropout+residual backward"
        ]
    assert _names(off.item("embed").forward) == ["embedding"]
    assert _names(on.item("embed").forward) == ["embedding", "embedding dropout"]


def test_without_attention_dropout_the_unfused_core_loses_its_dropout_kernel_only():
    """The core's other kernels keep their times: the share of HBM bandwidth they reach is solved
    from the measured core, which ran its dropout (chips.A100_UNFUSED_ATTENTION, p = 0.1)."""
    on = LayerKernels(CHIP, GPU, BASE).attention_core()
    off = LayerKernels(CHIP, GPU, dataclasses.replace(BASE, attention_dropout=False)).attention_core()
    kept = [k for k in on[0] if k.name != "attention dropout"]
    assert off[0] == kept and len(kept) == len(on[0]) - 1
    assert off[1] == [k for k in on[1] if k.name != "attention dropout backward"]


SCENARIO = """\
name: dropout
cluster:
  gpu: A100-SXM-80GB
  gpus_per_node: 2
  topology: {kind: switch, link_bandwidth: 300GB/s, link_latency: 1us}
  compute_model: kernel
model: {layers: 2, hidden: 1024, heads: 16, seq_len: 256, vocab: 1000, hidden_dropout: 0.0}
training: {global_batch: 2, micro_batch: 1}
parallel: {tp: 2}
schedule: 1f1b
"""


def test_the_switches_default_to_megatrons_and_the_presets_follow_their_models():
    """Megatron-LM's --hidden-dropout and --attention-dropout default to 0.1; Llama 2, Mixtral,
    DeepSeek-V3 and Qwen3 train without dropout, the GPT-3 presets with it."""
    spec = load_scenario_text(SCENARIO).model_spec
    assert (spec.hidden_dropout, spec.attention_dropout) == (0.0, 0.1)
    for name in ("llama2-7b", "llama2-13b", "mixtral-8x7b", "deepseek-v3-like", "qwen3-30b-a3b"):
        assert (MODELS[name].hidden_dropout, MODELS[name].attention_dropout) == (0.0, 0.0)
    assert (MODELS["gpt3-175b"].hidden_dropout, MODELS["gpt3-175b"].attention_dropout) == (0.1, 0.1)


@pytest.mark.parametrize("value", ["1.0", "-0.1"])
def test_a_probability_outside_zero_to_one_is_refused(value):
    with pytest.raises(ScenarioError, match="model.hidden_dropout"):
        load_scenario_text(SCENARIO.replace("hidden_dropout: 0.0", f"hidden_dropout: {value}"))
