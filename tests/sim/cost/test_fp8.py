"""FP8 GEMMs (training.fp8, Transformer Engine's FP8 linear layers) in the kernel model: their main
loop's rate from the measured FP8 ceiling, their casts, and the scenario's guards."""

import dataclasses

import pytest

from clustersim.sim.cost import gemm
from clustersim.sim.cost.kernels import LayerKernels
from clustersim.sim.cost.shapes import Shapes
from clustersim.sim.scenario.chips import CHIPS
from clustersim.sim.scenario.errors import ScenarioError
from clustersim.sim.scenario.hardware import GPUS
from clustersim.sim.scenario.loader import load_scenario_text

H100, H100_GPU = CHIPS["H100-SXM"], GPUS["H100-SXM"]


def test_fp8_speeds_up_the_main_loop_and_not_the_epilogue():
    """One wave of 12 x 11 = 132 tiles of 256x128 (73 MB of operands: 25 us, under the wave's 87 us
    or more, so compute-bound): the main loop at the FP8 ceiling's rate (Azure's cuBLASLt
    sweep, 1382.2 TFLOPS at 32768^3) or the BF16 one's, then the same epilogue, 132 tiles of BF16
    results (8.65 MB) at the achievable HBM bandwidth (2.90 TB/s, Azure's BabelStream Copy)."""
    chip = dataclasses.replace(H100, tiles=((256, 128),), launch_overhead_s=0.0)
    m, n, k = 256 * 12, 128 * 11, 8192
    epilogue_s = 132 * 256 * 128 * 2 / 2.90e12
    for fp8 in (False, True):
        mainloop_s = 2.0 * 256 * 128 * k / gemm.mainloop_rate(chip, H100_GPU, fp8)
        assert gemm.gemm_time_s(chip, H100_GPU, m, n, k, fp8=fp8) == pytest.approx(mainloop_s + epilogue_s, rel=1e-12)
    assert gemm.mainloop_rate(H100, H100_GPU, True) > gemm.mainloop_rate(H100, H100_GPU, False)


def test_a_split_accumulator_slows_the_main_loop_and_not_the_epilogue():
    """The same wave with FP32 promotion of the partial sums (cuBLASLt FAST_ACCUM 0): its main loop
    1.15 times longer (pytorch/ao#2377: fast accumulation 1.1-1.2x faster), its epilogue the same;
    BF16 GEMMs have no such mode."""
    chip = dataclasses.replace(H100, tiles=((256, 128),), launch_overhead_s=0.0)
    m, n, k = 256 * 12, 128 * 11, 8192
    epilogue_s = 132 * 256 * 128 * 2 / 2.90e12
    mainloop_s = 2.0 * 256 * 128 * k / gemm.mainloop_rate(chip, H100_GPU, True)
    split = gemm.gemm_time_s(chip, H100_GPU, m, n, k, fp8=True, split_accumulator=True)
    assert split == pytest.approx(1.15 * mainloop_s + epilogue_s, rel=1e-12)
    bf16 = gemm.gemm_time_s(chip, H100_GPU, m, n, k)
    assert gemm.gemm_time_s(chip, H100_GPU, m, n, k, split_accumulator=True) == bf16


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
    # Transformer Engine's accumulation per GEMM (module/base.py of v1.9): fast in the forward,
    # split in the input and weight gradients
    fc2 = {k.name: k.time_s for k in fp8.forward + fp8.backward}
    shapes = {"FC2": (tokens, 6144, width), "FC2 dgrad": (tokens, width, 6144), "FC2 wgrad": (width, 6144, tokens)}
    for name, (m, n, k) in shapes.items():
        split = name != "FC2"
        fp32 = name == "FC2 wgrad" and SHAPES.fp32_weight_gradients
        expected = gemm.gemm_time_s(H100, H100_GPU, m, n, k, fp8=True, accumulate_fp32=fp32, split_accumulator=split)
        assert fc2[name] == pytest.approx(expected, rel=1e-12)


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
