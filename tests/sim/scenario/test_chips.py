"""The accelerators' kernel-model data (sim.scenario.chips) against their datasheets, and the
cluster.compute_model switch as a scenario key."""

import re

import pytest

from clustersim.sim.scenario.chips import CHIPS
from clustersim.sim.scenario.hardware import GPUS
from clustersim.sim.scenario.json_schema import scenario_json_schema
from clustersim.sim.scenario.loader import load_scenario_text
from clustersim.sim.scenario.schema import ScenarioError


def test_every_gpu_has_one_chip_description():
    assert set(CHIPS) == set(GPUS)


@pytest.mark.parametrize("name", sorted(GPUS))
def test_datasheet_peak_is_units_times_rate_times_clock(name):
    """The datasheet's dense BF16 peak (GpuSpec) = units x FLOP per clock per unit x boost clock,
    to the datasheet's rounding (989.4 TFLOPS for H100 SXM; 312 for A100's 311.87)."""
    chip = CHIPS[name]
    assert chip.compute_units * chip.tensor_flops_per_clock * chip.boost_clock_hz == pytest.approx(
        GPUS[name].peak_flops, rel=1e-3
    )


@pytest.mark.parametrize("name", ["H100-SXM", "H200", "H800-SXM"])
def test_hopper_fp8_is_twice_bf16(name):
    """H100 whitepaper: dense FP8 1,978.9 TFLOPS, twice dense BF16's 989.4."""
    assert CHIPS[name].fp8_peak_flops == pytest.approx(2 * GPUS[name].peak_flops, rel=1e-3)


# BabelStream's CUDA Copy as Azure measured it (Azure/AI-benchmarking-guide, Azure_Results/
# ND_A100_v4_results.md, ND_H100_v5_results.md, ND_H200_v5_results.md, "HBM Bandwidth", TB/s).
BABELSTREAM_COPY_Bps = {"A100-SXM-80GB": 1.61e12, "H100-SXM": 2.90e12, "H200": 4.01e12}


@pytest.mark.parametrize("name", sorted(BABELSTREAM_COPY_Bps))
def test_a_streaming_kernel_runs_at_the_measured_copy_bandwidth(name):
    """The kernel model streams HBM at BabelStream's Copy rate on the GPU it was measured on."""
    gpu, chip = GPUS[name], CHIPS[name]
    assert gpu.hbm_bandwidth_Bps * chip.hbm_efficiency == pytest.approx(BABELSTREAM_COPY_Bps[name], rel=1e-9)


KERNEL = """
name: c
cluster: {{gpu: {gpu}, nodes: 1, gpus_per_node: 4, compute_model: kernel,
           topology: {{kind: switch, link_bandwidth: 300GB/s, link_latency: 1us}}}}
model: {{preset: gpt3-1.3b}}
training: {{global_batch: 8, micro_batch: 2, flash_attention: true}}
parallel: {{pp: 4}}
schedule: 1f1b
numerics: {{enabled: false}}
"""


def test_compute_model_and_flash_attention_are_scenario_keys():
    s = load_scenario_text(KERNEL.format(gpu="H100-SXM"), "c.yaml")
    assert s.cluster.compute_model == "kernel" and s.training.flash_attention
    assert s.resolved()["cluster"]["compute_model"] == "kernel"
    schema = scenario_json_schema()
    assert schema["$defs"]["ClusterSection"]["properties"]["compute_model"]["enum"] == ["roofline", "kernel"]
    assert "flash_attention" in schema["$defs"]["TrainingSection"]["properties"]


def test_rejects_the_kernel_model_on_a_chip_without_a_matmul_measurement():
    with pytest.raises(ScenarioError, match=re.escape("c.yaml: cluster.compute_model: kernel needs a measured")):
        load_scenario_text(KERNEL.format(gpu="TPU-v4"), "c.yaml")
