"""The kernel model's optimizer step and gradient accumulation (sim.cost.optimizer_step) against
the passes Megatron-LM's code makes, counted here from the source, pass by pass."""

import pytest

from clustersim.schedules.ir import Compute, Phase
from clustersim.sim.cost import gemm
from clustersim.sim.cost.kernel_times import KernelTimes
from clustersim.sim.cost.stages import stage_params
from clustersim.sim.scenario.chips import CHIPS
from clustersim.sim.scenario.hardware import GPUS
from clustersim.sim.scenario.loader import load_scenario_text

CHIP, GPU = CHIPS["A100-SXM-80GB"], GPUS["A100-SXM-80GB"]
SCENARIO = """
name: o
cluster: {{gpu: A100-SXM-80GB, nodes: 1, gpus_per_node: 4, compute_model: kernel,
           topology: {{kind: switch, link_bandwidth: 300GB/s, link_latency: 1us}}}}
model: {{preset: gpt3-1.3b}}
training: {{global_batch: 8, micro_batch: 2, dtype: {dtype}, recompute: full}}
parallel: {{pp: 4, tp: 1, dp: 1}}
schedule: {schedule}
numerics: {{enabled: false}}
"""
# FusedAdam (apex multi_tensor_adam) on fp32 tensors: reads gradient, weight, m, v; writes weight, m, v
ADAM = (4 + 3) * 4


def times(dtype: str, schedule: str = "1f1b") -> KernelTimes:
    return KernelTimes(load_scenario_text(SCENARIO.format(dtype=dtype, schedule=schedule), "o.yaml"))


def passes_s(params: float, bytes_per_param: list[int]) -> float:
    return sum(gemm.elementwise_time_s(CHIP, GPU, params * b) for b in bytes_per_param)


def optimizer_s(kernel_times: KernelTimes, stage: int) -> float:
    nbytes = stage_params(kernel_times.scenario, stage) * 28  # the program's OPT bytes (sim.build)
    return sum(kernel_times.classes_s(Compute(Phase.OPT, None, stage, nbytes=nbytes)))


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_bf16_step_is_megatron_2022s_passes(stage):
    """Megatron-LM 55ba1f7 (mid-2022), bf16: training.py zeroes the fp32 gradient buffer (write 4),
    DistributedDataParallel.allreduce_gradients divides it by the data-parallel size (read and
    write 4 + 4), clip_grad_norm_fp32's multi_tensor_l2norm reads it (4), FusedAdam, and
    _copy_main_params_to_model_params writes the bf16 weights from the fp32 ones (4 + 2)."""
    kt = times("bf16")
    params = stage_params(kt.scenario, stage)
    assert optimizer_s(kt, stage) == pytest.approx(passes_s(params, [4, 4 + 4, 4, ADAM, 4 + 2]), rel=1e-12)


def test_fp16_step_is_megatron_v2_5s_passes():
    """Megatron-LM v2.5 (2021), fp16 with a loss scale: allreduce_gradients flattens the fp16
    gradients (2 + 2), divides (2 + 2) and copies them back (2 + 2); _copy_model_grads_to_main_grads
    casts them to fp32 (2 + 4); _unscale_main_grads_and_check_for_nan reads and writes them (4 + 4);
    the norm (4), FusedAdam, and the fp16 weights written from the fp32 ones (4 + 2)."""
    kt = times("fp16")
    params = stage_params(kt.scenario, 1)
    expected = passes_s(params, [(2 + 2) * 3, 2 + 4, 4 + 4, 4, ADAM, 4 + 2])
    assert optimizer_s(kt, 1) == pytest.approx(expected, rel=1e-12)


def backward_s(kernel_times: KernelTimes, phase: Phase, microbatch: int, stage: int) -> float:
    return sum(kernel_times.classes_s(Compute(phase, microbatch, stage)))


@pytest.mark.parametrize("schedule,phase", [("1f1b", Phase.B), ("zb-h1", Phase.W)])
def test_fp16_backwards_after_the_first_accumulate_their_weight_gradients(schedule, phase):
    """fp16 gradients live in param.grad, which autograd's AccumulateGrad sums in place (read 2 + 2,
    write 2) from the second microbatch on: one pass over the stage's GEMM weights, 6 layers of
    4h^2 (QKV, projection) + 2hf (the MLP) for GPT-3 1.3B (h 2048, f 8192) on a middle stage. The
    zero-bubble schedule pays it in the W op, which holds the weight gradients."""
    kt = times("fp16", schedule)
    h, f = 2048, 8192
    weights = 6 * (4 * h * h + 2 * h * f)
    extra = backward_s(kt, phase, 1, 1) - backward_s(kt, phase, 0, 1)
    assert extra == pytest.approx(gemm.elementwise_time_s(CHIP, GPU, weights * (2 + 2 + 2)), rel=1e-9)


def test_bf16_accumulates_inside_the_weight_gradient_gemm():
    """bf16 (fp32 main gradients, --gradient-accumulation-fusion): no pass of its own."""
    kt = times("bf16")
    assert backward_s(kt, Phase.B, 1, 1) == backward_s(kt, Phase.B, 0, 1)
