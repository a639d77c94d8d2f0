"""FP8 GEMMs (training.fp8, Transformer Engine's FP8 linear layers) in the kernel model: their rate
from the measured FP8 and BF16 matmul ceilings, their casts, and the scenario's guards."""

import dataclasses

import pytest

from clustersim.sim.cost import gemm
from clustersim.sim.cost.kernels import LayerKernels, Shapes
from clustersim.sim.scenario.chips import CHIPS
from clustersim.sim.scenario.errors import ScenarioError
from clustersim.sim.scenario.hardware import GPUS
from clustersim.sim.scenario.loader import load_scenario_text

H100, H100_GPU = CHIPS["H100-SXM"], GPUS["H100-SXM"]
# stas00/ml-engineering compute/accelerator/README.md, MAMF table: BF16 792.1 TFLOPS (CUDA 12.1),
# FP8 (float8_e4m3fn) 1402.6 TFLOPS (torch 2.7.0+cu126) on an H100 SXM
H100_BF16_MAMF, H100_FP8_MAMF = 792.1e12, 1402.6e12


def rate(chip, gpu, m, n, k, fp8):
    no_gap = dataclasses.replace(chip, launch_overhead_s=0.0)
    return 2.0 * m * n * k / gemm.gemm_time_s(no_gap, gpu, m, n, k, fp8=fp8)


def test_fp8_runs_the_measured_ratio_of_the_fp8_and_bf16_ceilings_faster():
    assert gemm.fp8_speedup(H100, H100_GPU) == pytest.approx(H100_FP8_MAMF / H100_BF16_MAMF, rel=1e-12)
    m, n, k = 8192, 2304, 6144  # GPT-3 22B's QKV on a tensor-parallel rank of 8 (compute-bound)
    assert rate(H100, H100_GPU, m, n, k, True) / rate(H100, H100_GPU, m, n, k, False) == pytest.approx(
        H100_FP8_MAMF / H100_BF16_MAMF, rel=1e-12
    )


def test_the_best_fp8_shape_reaches_the_measured_fp8_ceiling_and_no_more():
    """MAMF is the best of a sweep of shapes: the model's best (shapes that fill whole waves of
    every tile) must land on it, not above."""
    shapes = [(256 * 132 * a, 128 * b, 4096) for a in (1, 2) for b in (8, 16, 32)]
    best = max(rate(H100, H100_GPU, m, n, k, True) for m, n, k in shapes)
    assert best == pytest.approx(H100_FP8_MAMF, rel=0.01)
    assert best <= H100_FP8_MAMF * 1.002


def test_at_the_measured_fp8_shape_the_model_is_within_a_fifth():
    """At 1024 x 9216 x 14336, where the FP8 ceiling was measured, BF16 tiles of 256 x 128 fill
    their third wave only 18%: the model (BF16 tiles and waves at the FP8 rate) is 12.6% below
    the measurement. FP8 kernels evidently do not quantise that way; the bound says how far this
    model may be from a measured FP8 GEMM."""
    c = H100.fp8_matmul_ceiling
    predicted = rate(H100, H100_GPU, c.m, c.n, c.k, True)
    assert predicted == pytest.approx(H100_FP8_MAMF, rel=0.2)
    assert predicted < H100_FP8_MAMF


SHAPES = Shapes(
    micro_batch=1, seq_len=2048, hidden=6144, heads=64, ffn=4 * 6144, vocab=51200, tp=8,
    sequence_parallel=True, gated_mlp=False, flash_attention=True, dtype_bytes=2,
)  # fmt: skip


def test_an_fp8_linear_layer_casts_its_input_and_its_gradient_and_keeps_its_flops():
    bf16 = LayerKernels(H100, H100_GPU, SHAPES).item("mlp")
    fp8 = LayerKernels(H100, H100_GPU, dataclasses.replace(SHAPES, fp8=True)).item("mlp")
    assert sum(k.flops for k in fp8.forward + fp8.backward) == sum(k.flops for k in bf16.forward + bf16.backward)
    casts = {k.name: k for k in fp8.forward + fp8.backward if "FP8 cast" in k.name}
    assert set(casts) == {"FC1 FP8 cast", "FC1 dY FP8 cast", "FC2 FP8 cast", "FC2 dY FP8 cast"}
    tokens, width = 2048, 4 * 6144 // 8
    # FC2's input X is (T x f/t); read in BF16 (2 bytes), written as two FP8 copies (2 bytes)
    expected = gemm.elementwise_time_s(H100, H100_GPU, tokens * width * 4)
    assert casts["FC2 FP8 cast"].time_s == pytest.approx(expected, rel=1e-12)

    def gemm_s(kernels):
        return sum(k.time_s for k in kernels if k.klass == "gemm")

    assert gemm_s(fp8.forward) < gemm_s(bf16.forward)


SCENARIO = """
name: fp8
cluster:
  gpu: {gpu}
  compute_model: {model}
  nodes: 1
  gpus_per_node: 8
  topology: {{kind: dgx, nvlink_bandwidth: 450GB/s, nic_bandwidth: 50GB/s, link_latency: 1us}}
model: {{layers: 4, hidden: 1024, heads: 16, ffn: 4096, seq_len: 512, vocab: 1024}}
training: {{global_batch: 8, micro_batch: 1, fp8: true}}
parallel: {{tp: 8}}
numerics: {{enabled: false}}
"""


@pytest.mark.parametrize(
    "gpu,model,reason",
    [("H100-SXM", "roofline", "needs cluster.compute_model: kernel"), ("A100-SXM-80GB", "kernel", "not A100-SXM-80GB")],
)
def test_fp8_needs_the_kernel_model_and_a_gpu_with_a_measured_fp8_ceiling(gpu, model, reason):
    with pytest.raises(ScenarioError, match=rf"f.yaml: training.fp8: .*{reason}"):
        load_scenario_text(SCENARIO.format(gpu=gpu, model=model), "f.yaml")
    assert load_scenario_text(SCENARIO.format(gpu="H100-SXM", model="kernel"), "f.yaml").training.fp8
