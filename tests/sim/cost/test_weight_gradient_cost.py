"""The split backward's costs: W is the forward FLOPs of a stage's weight matmuls (Megatron's
24bsh^2 per layer for f = 4h, plus the LM head's 2bshV on the last stage), B the rest of the
backward; B + W is the whole backward the unsplit schedules charge."""

import pytest

from clustersim.schedules.ir import Compute, Phase
from clustersim.sim.build import make_program
from clustersim.sim.cost.stages import stage_forward_flops, stage_weight_gradient_flops
from clustersim.sim.scenario.loader import load_scenario_text

SCENARIO = """
name: w
cluster: {{gpu: A100-SXM-80GB, nodes: 1, gpus_per_node: 4,
           topology: {{kind: switch, link_bandwidth: 300GB/s, link_latency: 1us}}}}
model: {{preset: gpt3-1.3b}}
training: {{global_batch: 16, micro_batch: 2, dtype: bf16, recompute: {recompute}}}
parallel: {{pp: 2, dp: {dp}, tp: {tp}, sequence_parallel: {sp}, virtual: {virtual}}}
schedule: {schedule}
numerics: {{enabled: false}}
"""


def scenario(schedule="zb-h1", virtual=1, recompute="none", tp=1, sp=False):
    text = SCENARIO.format(
        schedule=schedule, virtual=virtual, recompute=recompute, dp=2 // tp, tp=tp, sp=str(sp).lower()
    )
    return load_scenario_text(text, "w.yaml")


def test_w_is_the_weight_matmuls_forward_flops():
    s = scenario()
    b, seq, h, vocab = 2, 2048, 2048, s.model_spec.vocab  # GPT-3 1.3B: 24 layers, 12 per stage
    assert stage_weight_gradient_flops(s, 0) == pytest.approx(12 * 24 * b * seq * h * h, rel=1e-12)
    assert stage_weight_gradient_flops(s, 1) == pytest.approx(
        12 * 24 * b * seq * h * h + 2 * b * seq * h * vocab, rel=1e-12
    )
    assert stage_forward_flops(s, 0) - stage_weight_gradient_flops(s, 0) == pytest.approx(
        12 * 4 * b * seq * seq * h, rel=1e-12
    )


@pytest.mark.parametrize("tp,sp", [(1, False), (2, False), (2, True)])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_b_plus_w_is_the_unsplit_backward(recompute, tp, sp):
    """Summed over a backward's tensor-parallel pieces; W is one whole op, cut at no collective."""
    split = make_program(scenario("zb-h1", 1, recompute, tp, sp))
    whole = make_program(scenario("1f1b", 1, recompute, tp, sp))

    def flops(program, phase, stage):
        rank = stage * tp  # the first tensor-parallel rank of the stage
        return sum(
            op.flops
            for op in program.ops[rank]
            if isinstance(op, Compute) and (op.phase, op.microbatch, op.stage) == (phase, 0, stage)
        )

    for stage in (0, 1):
        b, w = flops(split, Phase.B, stage), flops(split, Phase.W, stage)
        assert b + w == pytest.approx(flops(whole, Phase.B, stage), rel=1e-12)
        assert w == pytest.approx(stage_weight_gradient_flops(scenario(tp=tp, sp=sp), stage), rel=1e-12)
