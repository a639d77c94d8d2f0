"""The layer's kernels (sim.cost.kernels) against Megatron's FLOP formulas (sim.cost.compute), and
the ops' kernels (sim.cost.kernel_times) against recompute as Korthikanti et al. 2022 publish it."""

import dataclasses

import pytest

from clustersim.schedules.ir import Compute, Phase
from clustersim.sim.build import compute_time_fn, make_program
from clustersim.sim.cost import compute as cost
from clustersim.sim.cost import gemm
from clustersim.sim.cost.kernel_times import KernelTimes
from clustersim.sim.cost.kernels import LayerKernels
from clustersim.sim.cost.shapes import Shapes
from clustersim.sim.scenario.chips import CHIPS
from clustersim.sim.scenario.hardware import GPUS
from clustersim.sim.scenario.loader import load_scenario_text
from clustersim.sim.scenario.presets import MoESpec

CHIP, GPU = CHIPS["A100-SXM-80GB"], GPUS["A100-SXM-80GB"]
# GPT-3 175B on a tensor-parallel group of 8 (Korthikanti et al. 2022, Table 3)
GPT3 = Shapes(
    micro_batch=1, seq_len=2048, hidden=12288, heads=96, ffn=4 * 12288, vocab=51200, tp=8,
    sequence_parallel=True, gated_mlp=False, flash_attention=False, dtype_bytes=2,
)  # fmt: skip


def flops(kernels, part=None):
    return sum(k.flops for k in kernels if part is None or k.part == part)


@pytest.mark.parametrize("flash", [False, True])
@pytest.mark.parametrize("gated", [False, True])
def test_forward_kernel_flops_are_megatrons_layer_formula(flash, gated):
    sh = dataclasses.replace(GPT3, flash_attention=flash, gated_mlp=gated)
    layer = LayerKernels(CHIP, GPU, sh)
    b, s, h, t = sh.micro_batch, sh.seq_len, sh.hidden, sh.tp
    assert flops(layer.attn().forward) * t == pytest.approx(cost.attention_forward_flops(b, s, h), rel=1e-12)
    assert flops(layer.mlp().forward) * t == pytest.approx(cost.mlp_forward_flops(b, s, h, sh.ffn, gated), rel=1e-12)
    assert flops(layer.head().forward) * t == pytest.approx(cost.head_forward_flops(b, s, h, sh.vocab), rel=1e-12)


def test_the_cross_entropy_makes_megatrons_passes_over_the_fp32_logits():
    """megatron/core/tensor_parallel/cross_entropy.py on each rank's (T x V/t) logits, cast to fp32
    by the caller (logits.float(): read 2, write 4 bytes), then max (read 4), subtract it in place,
    exp in place (read and write 4 each), sum (read 4), divide in place (read and write 4): 38 bytes
    a logit forward; the backward scales the kept softmax in place (4 + 4) and casts it back for the
    logits' GEMMs (4 + 2): 14."""
    head = LayerKernels(CHIP, GPU, GPT3).item("head")
    logits = GPT3.micro_batch * GPT3.seq_len * GPT3.vocab // GPT3.tp
    forward = next(k for k in head.forward if k.name == "cross-entropy")
    backward = next(k for k in head.backward if k.name == "cross-entropy backward")
    assert forward.time_s == pytest.approx(gemm.elementwise_time_s(CHIP, GPU, logits * 38), rel=1e-12)
    assert backward.time_s == pytest.approx(gemm.elementwise_time_s(CHIP, GPU, logits * 14), rel=1e-12)


@pytest.mark.parametrize("item", ["attn", "mlp", "head"])
def test_backward_gemm_flops_are_twice_the_forward(item):
    kernels = LayerKernels(CHIP, GPU, GPT3).item(item)
    assert flops(kernels.backward) == pytest.approx(2 * flops(kernels.forward), rel=1e-12)


def test_weight_gradients_are_the_forward_of_the_weight_matmuls():
    """W per layer = 24 b s h^2 / t for f = 4h: the forward less the attention core (sim.cost.stages)."""
    layer = LayerKernels(CHIP, GPU, GPT3)
    w = flops(layer.attn().backward, "W") + flops(layer.mlp().backward, "W")
    b, s, h, t = GPT3.micro_batch, GPT3.seq_len, GPT3.hidden, GPT3.tp
    assert w == pytest.approx(24 * b * s * h * h / t, rel=1e-12)


def test_moe_kernel_flops_are_the_moe_formula():
    moe = MoESpec(num_experts=8, top_k=2, expert_ffn=14336, shared_experts=1)
    sh = dataclasses.replace(GPT3, hidden=4096, heads=32, gated_mlp=True, tp=2, moe=moe, ep=2, seq_len=4096)
    layer = LayerKernels(CHIP, GPU, sh)
    forward = flops(layer.router().forward) + flops(layer.experts().forward)
    expected = cost.moe_mlp_forward_flops(sh.micro_batch, sh.seq_len, sh.hidden, moe, True) / sh.tp
    assert forward == pytest.approx(expected, rel=1e-12)


SCENARIO = """
name: k
cluster: {{gpu: A100-SXM-80GB, nodes: 1, gpus_per_node: 4, compute_model: kernel,
           topology: {{kind: switch, link_bandwidth: 300GB/s, link_latency: 1us}}}}
model: {{preset: gpt3-1.3b}}
training: {{global_batch: 8, micro_batch: 2, dtype: bf16, recompute: {recompute}}}
parallel: {{pp: 4, tp: 1, dp: 1}}
schedule: {schedule}
numerics: {{enabled: false}}
"""


def scenario(recompute="none", schedule="1f1b"):
    return load_scenario_text(SCENARIO.format(recompute=recompute, schedule=schedule), "k.yaml")


def op_flops(times: KernelTimes, phase: Phase, stage: int) -> float:
    return flops(times.kernels_of(Compute(phase, 0, stage)))


def test_selective_recompute_adds_korthikantis_attention_core_flops():
    """Korthikanti et al. 2022 (arXiv:2205.05198), Appendix A: "Selective activation recomputation
    requires an additional forward pass attention matrix computation (2Bs^2h operations) and
    attention over values (2Bs^2h operations)": 4 B s^2 h per layer (section 5 quotes 2.7% for
    GPT-3). Their Equation 8, 72BLsh^2 (1 + s/3h + v/12hL), does not follow from that sentence:
    less Equation 7 it leaves 12 B L s^2 h, three times the itemised recompute."""
    none, selective = KernelTimes(scenario("none")), KernelTimes(scenario("selective"))
    b, s, h = 2, 2048, 2048  # GPT-3 1.3B: 24 layers, 6 per stage
    for stage in (1, 2):
        extra = op_flops(selective, Phase.B, stage) - op_flops(none, Phase.B, stage)
        assert extra == pytest.approx(6 * (2 * b * s * s * h + 2 * b * s * s * h), rel=1e-12)


def test_full_recompute_adds_one_forward():
    none, full = KernelTimes(scenario("none")), KernelTimes(scenario("full"))
    for stage in (1, 2):  # a middle stage: layers only
        extra = op_flops(full, Phase.B, stage) - op_flops(none, Phase.B, stage)
        assert extra == pytest.approx(op_flops(none, Phase.F, stage), rel=1e-12)


def test_a_recompute_op_is_the_recompute_alone():
    """An R op (a schedule that recomputes apart from its backward): the extra FLOPs above."""
    b, s, h = 2, 2048, 2048
    assert op_flops(KernelTimes(scenario("selective")), Phase.R, 1) == pytest.approx(6 * 4 * b * s * s * h, rel=1e-12)
    full = KernelTimes(scenario("full"))
    assert op_flops(full, Phase.R, 1) == pytest.approx(op_flops(full, Phase.F, 1), rel=1e-12)
    assert op_flops(KernelTimes(scenario("none")), Phase.R, 1) == 0.0


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_split_backward_and_weight_gradient_take_the_unsplit_backwards_time(recompute):
    split = KernelTimes(scenario(recompute, "zb-h1"))
    whole = KernelTimes(scenario(recompute, "1f1b"))
    assert (0, 1) in split.split
    for stage in range(4):
        b = sum(split.classes_s(Compute(Phase.B, 0, stage)))
        w = sum(split.classes_s(Compute(Phase.W, 0, stage)))
        assert b + w == pytest.approx(sum(whole.classes_s(Compute(Phase.B, 0, stage))), rel=1e-12)


def test_op_flops_stay_the_counted_model_flops():
    """The kernel model times the ops; their FLOPs (MFU) are the program's, unchanged."""
    s = scenario("selective")
    program = make_program(s)
    time_s = compute_time_fn(s)
    times = KernelTimes(s)
    for op in program.ops[1]:
        if isinstance(op, Compute):
            assert time_s(op) == pytest.approx(sum(times.classes_s(op)), rel=1e-12)
            if op.phase == Phase.F:
                assert op.flops == pytest.approx(op_flops(times, Phase.F, op.stage), rel=1e-12)


CONFIGS = """
name: c
cluster: {{gpu: H100-SXM, nodes: 1, gpus_per_node: 8, compute_model: kernel,
           topology: {{kind: switch, link_bandwidth: 450GB/s, link_latency: 1us}}}}
model: {{layers: 4, hidden: 1024, heads: 16, ffn: 4096, seq_len: 1024, vocab: 32000, gated_mlp: true,
         moe: {{experts: 8, top_k: 2, expert_ffn: 2048, shared_experts: 1, first_dense: 1}}}}
training: {{global_batch: 16, micro_batch: 2, recompute: {recompute}}}
parallel: {{pp: 2, tp: {tp}, dp: {dp}, ep: {ep}, sequence_parallel: {sp}}}
schedule: {schedule}
numerics: {{enabled: false}}
"""


@pytest.mark.parametrize("recompute", ["none", "selective"])
@pytest.mark.parametrize("tp,dp,ep,sp", [(1, 4, 1, "false"), (2, 2, 2, "true"), (4, 1, 1, "false")])
@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_every_ops_kernels_account_for_its_counted_flops(recompute, tp, dp, ep, sp, schedule):
    """Each compute op of a dense + MoE model, whole or cut by tensor parallelism, split or not:
    its kernels' model FLOPs are the FLOPs the program counts for it (sim.cost.stages)."""
    text = CONFIGS.format(recompute=recompute, tp=tp, dp=dp, ep=ep, sp=sp, schedule=schedule)
    s = load_scenario_text(text, "c.yaml")
    times, program = KernelTimes(s), make_program(s)
    for rank in (min(program.ops), max(program.ops)):
        for op in program.ops[rank]:
            if isinstance(op, Compute) and op.phase != Phase.OPT:
                assert flops(times.kernels_of(op)) == pytest.approx(op.flops, rel=1e-12), op.label


@pytest.mark.parametrize("parallel", ["megatron: {overlap_grad_reduce: true}", "zero: 3"])
def test_ops_cut_at_units_run_the_kernels_of_the_whole_op(parallel):
    """Overlapped gradient reduction (one layer per unit) and ZeRO 3 cut a stage's ops into pieces
    at unit starts even at tp 1: the pieces' kernels are the whole op's, split, so every kernel
    class takes the same time as in the uncut run (this once raised an IndexError)."""
    from clustersim.sim.run import simulate

    text = """
name: cut
cluster:
  {{gpu: H100-SXM, nodes: 1, gpus_per_node: 8, compute_model: kernel, topology: {{kind: dgx, link_latency: 1us}}}}
model: {{preset: tiny-8l}}
training: {{global_batch: 16, micro_batch: 1}}
parallel: {{tp: 1, pp: 1, dp: 8, {extra}}}
numerics: {{enabled: false}}
"""
    cut = simulate(load_scenario_text(text.format(extra=parallel))).summary["time_breakdown_s"]
    whole = simulate(load_scenario_text(text.format(extra="zero: 0"))).summary["time_breakdown_s"]
    for klass, seconds in whole["compute_by_kernel_class"].items():
        if klass != "optimizer":  # ZeRO 3 steps a shard of the optimizer states
            assert cut["compute_by_kernel_class"][klass] == pytest.approx(seconds, rel=1e-9)
