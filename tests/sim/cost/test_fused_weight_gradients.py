"""Weight gradients accumulated inside their GEMMs (Megatron-LM's gradient-accumulation fusion) in
the kernel model: which runs do it, and what it costs a layer's weight-gradient kernels."""

import dataclasses

import pytest

from clustersim.sim.cost import gemm
from clustersim.sim.cost.kernel_times import shapes_of
from clustersim.sim.cost.kernels import LayerKernels
from clustersim.sim.cost.shapes import Shapes
from clustersim.sim.scenario.chips import CHIPS
from clustersim.sim.scenario.hardware import GPUS
from clustersim.sim.scenario.loader import load_scenario_text

H100, H100_GPU = CHIPS["H100-SXM"], GPUS["H100-SXM"]
SHAPES = Shapes(
    micro_batch=4, seq_len=2048, hidden=4096, heads=32, ffn=4 * 4096, vocab=50304, tp=1,
    sequence_parallel=False, gated_mlp=False, flash_attention=True, dtype_bytes=2,
)  # fmt: skip


@pytest.mark.parametrize("fp8", [False, True])
def test_only_the_weight_gradients_accumulate_in_fp32(fp8):
    """NeMo GPT-3 5B's MLP (tokens 8192, h 4096, f 16384): with the fusion the weight gradients'
    GEMMs cost what an FP32-accumulating GEMM of their shape costs; the forward and the input
    gradients do not change."""
    plain = LayerKernels(H100, H100_GPU, dataclasses.replace(SHAPES, fp8=fp8)).item("mlp")
    fused = LayerKernels(H100, H100_GPU, dataclasses.replace(SHAPES, fp8=fp8, fp32_weight_gradients=True)).item("mlp")
    assert [k.time_s for k in fused.forward] == [k.time_s for k in plain.forward]
    for before, after in zip(plain.backward, fused.backward, strict=True):
        if before.part != "W":
            assert after.time_s == before.time_s
    fc1 = next(k for k in fused.backward if k.name == "FC1 wgrad")  # (h x f) = X^T (h x T) dY (T x f)
    expected = gemm.gemm_time_s(H100, H100_GPU, 4096, 16384, 8192, fp8=fp8, accumulate_fp32=True, split_accumulator=fp8)
    assert fc1.time_s == pytest.approx(expected, rel=1e-12)
    assert fc1.time_s > next(k for k in plain.backward if k.name == "FC1 wgrad").time_s


SCENARIO = """
name: fusion
cluster:
  gpu: A100-SXM-80GB
  compute_model: kernel
  nodes: 1
  gpus_per_node: 8
  topology: {{kind: dgx, nvlink_bandwidth: 300GB/s, nic_bandwidth: 25GB/s, link_latency: 1us}}
model: {{layers: 4, hidden: 1024, heads: 16, ffn: 4096, seq_len: 512, vocab: 1024}}
training: {{global_batch: 8, micro_batch: 1, dtype: {dtype}}}
parallel: {{tp: 8}}
numerics: {{enabled: false}}
"""


@pytest.mark.parametrize("dtype,fused", [("bf16", True), ("fp16", False), ("fp32", False)])
def test_bf16_runs_accumulate_in_the_gemm_and_the_others_do_not(dtype, fused):
    """As sim.cost.optimizer_step reads Megatron-LM: bf16 accumulates inside the weight-gradient
    GEMM; fp16 (v2.5) sums into param.grad with autograd, fp32 with DDP's hook, separate passes."""
    scenario = load_scenario_text(SCENARIO.format(dtype=dtype), "f.yaml")
    assert shapes_of(scenario).fp32_weight_gradients is fused
