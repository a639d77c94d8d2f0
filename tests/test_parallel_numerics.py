"""The whole toolbox proven on the shadow model: for tensor parallel 1, 2, 4 (sequence parallel on
and off), pipeline 1, 2, data parallel 1, 2, ZeRO 0-3, GPipe / 1F1B / interleaved (v = 2) and
recompute none / full, the weights after one Adam step equal one device's on the global batch
(float64, relative 1e-10, as `max_errors` measures it). Each case is a full `simulate` run: real
shards through the real collectives, timed by the engine."""

import itertools

import pytest

from sim.run import simulate
from sim.scenario_loader import load_scenario_text

SCENARIO = """
name: toolbox
cluster: {{gpu: H100-SXM, nodes: 1, gpus_per_node: {gpus},
           topology: {{kind: switch, link_bandwidth: 450GB/s, link_latency: 1us}}}}
model: {{layers: 4, hidden: 1024, heads: 16, ffn: 4096, seq_len: 1024, vocab: 32000}}
training: {{global_batch: {global_batch}, micro_batch: 1, dtype: bf16, recompute: {recompute}}}
parallel: {{tp: {tp}, pp: {pp}, dp: {dp}, virtual: {virtual}, zero: {zero}, sequence_parallel: {sp}, bucket: 8MB}}
schedule: {schedule}
numerics: {{hidden: 16, heads: 4, seq_len: 8, vocab: 32, micro_batch: 2, optimizer: adam, lr: 0.01}}
"""


def run(tp: int, pp: int, dp: int, sp: bool, zero: int, schedule: str, recompute: str) -> dict:
    virtual = 2 if schedule == "interleaved" else 1
    microbatches = 2 * pp  # the interleaved schedule runs them in groups of pp
    text = SCENARIO.format(gpus=tp * pp * dp, global_batch=microbatches * dp, recompute=recompute, tp=tp, pp=pp,
                           dp=dp, virtual=virtual, zero=zero, sp=str(sp).lower(), schedule=schedule)
    return simulate(load_scenario_text(text, "toolbox.yaml")).summary


# the full product; sequence parallelism needs tp > 1, and ZeRO shards over dp > 1 (with dp = 1
# every stage is the same plain step)
CASES = [(tp, pp, dp, sp, zero, schedule, recompute)
         for tp, sp in ((1, False), (2, False), (2, True), (4, False), (4, True))
         for pp, dp in itertools.product((1, 2), (1, 2))
         for zero in (range(4) if dp > 1 else (0,))
         for schedule in ("gpipe", "1f1b", "interleaved")
         for recompute in ("none", "full")]


@pytest.mark.parametrize("tp,pp,dp,sp,zero,schedule,recompute", CASES)
def test_weights_after_one_step_match_one_device(tp, pp, dp, sp, zero, schedule, recompute):
    summary = run(tp, pp, dp, sp, zero, schedule, recompute)
    assert summary["numerics_max_rel_err"] < 1e-10
    assert summary["numerics"]["loss"] == pytest.approx(summary["numerics"]["reference_loss"], rel=1e-12)


MOE_SCENARIO = SCENARIO.replace("vocab: 32000}}", "vocab: 32000, moe: {{experts: 8, top_k: {top_k}, every: 2, "
                                "expert_ffn: 2048, shared_experts: {shared}}}}}")


@pytest.mark.parametrize("pp,dp,top_k,shared", [(1, 1, 1, 0), (2, 1, 2, 0), (2, 2, 2, 1), (1, 2, 1, 1)])
def test_moe_layers_match_one_device(pp, dp, top_k, shared):
    """The shadow model's MoE layers (every second layer, 8 experts, Switch top-1 or Mixtral-style
    renormalised top-2, with and without a shared expert, no dropping), pipelined and data-parallel
    without expert parallelism."""
    text = MOE_SCENARIO.format(gpus=pp * dp, global_batch=2 * pp * dp, recompute="none", tp=1, pp=pp, dp=dp,
                               virtual=1, zero=1 if dp > 1 else 0, sp="false", schedule="1f1b", top_k=top_k,
                               shared=shared)
    summary = simulate(load_scenario_text(text, "moe.yaml")).summary
    assert summary["numerics_max_rel_err"] < 1e-10
    assert summary["numerics"]["loss"] == pytest.approx(summary["numerics"]["reference_loss"], rel=1e-12)
