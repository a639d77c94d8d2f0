"""parallel.megatron.grad_reduce_in_fp32: gradients kept and reduced in FP32, as Megatron-LM forces
with bf16 (megatron/training/arguments.py: --accumulate-allreduce-grads-in-fp32) and Apex's
DistributedFusedAdam does unless grad_sync_dtype is set (its grad_sync_dtype defaults to the state
dtype, FP32; NeMo 24.07's distributed_fused_adam leaves it). The reductions move 4 bytes a
parameter, the weight all-gathers still 2, and the gradient buffer holds 4."""

import pytest

from clustersim.schedules.ir import Collective, Compute
from clustersim.sim.cost.stages import stage_params
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario_text

SCENARIO = """
name: fp32_grads
cluster: {{gpu: A100-SXM-80GB, nodes: 1, gpus_per_node: 4, compute_model: {model},
           topology: {{kind: switch, link_bandwidth: 300GB/s, link_latency: 1us}}}}
model: {{layers: 4, hidden: 1024, heads: 16, ffn: 4096, seq_len: 1024, vocab: 32000}}
training: {{global_batch: 8, micro_batch: 1, dtype: {dtype}}}
parallel: {{tp: 1, pp: 2, dp: 2, zero: 1, bucket: 40MB{megatron}}}
schedule: 1f1b
numerics: {{enabled: false}}
"""


def scenario(model: str = "kernel", dtype: str = "bf16", fp32: bool | None = None):
    megatron = "" if fp32 is None else f", megatron: {{grad_reduce_in_fp32: {str(fp32).lower()}}}"
    return load_scenario_text(SCENARIO.format(model=model, dtype=dtype, megatron=megatron), "fp32_grads.yaml")


@pytest.mark.parametrize(
    "model,dtype,fp32,want",
    [
        ("kernel", "bf16", None, True),  # Megatron-LM's bf16
        ("kernel", "fp16", None, False),  # its fp16 keeps 16-bit gradients (Narayanan et al.'s runs)
        ("roofline", "bf16", None, False),  # the textbook: gradients the weights' size
        ("kernel", "bf16", False, False),
        ("roofline", "bf16", True, True),
    ],
)
def test_on_by_default_where_megatron_has_it(model, dtype, fp32, want):
    s = scenario(model, dtype, fp32)
    assert s.grad_reduce_in_fp32 is want
    assert s.gradient_bytes == (4.0 if want else 2.0)


@pytest.mark.parametrize("fp32", [False, True])
def test_reductions_move_the_gradient_bytes_and_gathers_the_weights(fp32):
    result = simulate(scenario("roofline", fp32=fp32))
    for rank, ops in result.program.ops.items():
        stage = next(op.stage for op in ops if isinstance(op, Compute))
        params = stage_params(result.scenario, stage)
        moved = {"reduce_scatter": 0.0, "all_gather": 0.0}
        for op in ops:
            if isinstance(op, Collective) and op.kind in moved:
                moved[op.kind] += op.nbytes
        assert moved == pytest.approx({"reduce_scatter": (4 if fp32 else 2) * params, "all_gather": 2 * params}), rank


@pytest.mark.parametrize("fp32", [False, True])
def test_the_gradient_buffer_holds_four_bytes_a_parameter(fp32):
    result = simulate(scenario("roofline", fp32=fp32))
    peaks = result.summary["memory_peak_bytes_per_rank"]
    for rank, ops in result.program.ops.items():
        stage = next(op.stage for op in ops if isinstance(op, Compute))
        want = (4 if fp32 else 2) * stage_params(result.scenario, stage)
        assert peaks[str(rank)]["gradients"] == pytest.approx(want, rel=1e-12), rank
