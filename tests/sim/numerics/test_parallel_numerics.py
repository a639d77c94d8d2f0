"""The whole toolbox proven on the shadow model: for tensor parallel 1, 2, 4 (sequence parallel on
and off), pipeline 1, 2, data parallel 1, 2, ZeRO 0-3, GPipe / 1F1B / interleaved (v = 2) and
recompute none / full, the weights after one Adam step equal one device's on the global batch
(float64, relative 1e-10, as `max_errors` measures it). Each case is a full `simulate` run: real
shards through the real collectives, timed by the engine."""

import itertools

import numpy as np
import pytest

from clustersim.schedules.ir import Compute
from clustersim.schedules.pipeline import SCHEDULES
from clustersim.schedules.stage_pieces import tp_stage_plan
from clustersim.sim.cost.stages import stage_moe_layers
from clustersim.sim.numerics.moe import experts_of_rank
from clustersim.sim.report import terminal_summary
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario_text

SCENARIO = """
name: toolbox
cluster: {{gpu: H100-SXM, nodes: 1, gpus_per_node: {gpus},
           topology: {{kind: switch, link_bandwidth: 450GB/s, link_latency: 1us}}}}
model: {{layers: 4, hidden: 1024, heads: 16, ffn: 4096, seq_len: 1024, vocab: 32000}}
training: {{global_batch: {global_batch}, micro_batch: 1, dtype: bf16, recompute: {recompute}}}
parallel: {{tp: {tp}, pp: {pp}, dp: {dp}, virtual: {virtual}, zero: {zero}, sequence_parallel: {sp}, bucket: 8MB{more}}}
schedule: {schedule}
numerics: {{hidden: 16, heads: 4, seq_len: 8, vocab: 32, micro_batch: 2, optimizer: adam, lr: 0.01}}
"""


def run(tp: int, pp: int, dp: int, sp: bool, zero: int, schedule: str, recompute: str, more: str = "") -> dict:
    virtual = 2 if SCHEDULES[schedule].chunks_per_rank else 1
    microbatches = 2 * pp  # the interleaved schedule runs them in groups of pp
    text = SCENARIO.format(
        gpus=tp * pp * dp,
        global_batch=microbatches * dp,
        recompute=recompute,
        tp=tp,
        pp=pp,
        dp=dp,
        virtual=virtual,
        zero=zero,
        sp=str(sp).lower(),
        schedule=schedule,
        more=more,
    )
    return simulate(load_scenario_text(text, "toolbox.yaml")).summary


# the full product; sequence parallelism needs tp > 1, and ZeRO shards over dp > 1 (with dp = 1
# every stage is the same plain step)
CASES = [
    (tp, pp, dp, sp, zero, schedule, recompute)
    for tp, sp in ((1, False), (2, False), (2, True), (4, False), (4, True))
    for pp, dp in itertools.product((1, 2), (1, 2))
    for zero in (range(4) if dp > 1 else (0,))
    for schedule in ("gpipe", "1f1b", "interleaved")
    for recompute in ("none", "full")
]


@pytest.mark.parametrize("tp,pp,dp,sp,zero,schedule,recompute", CASES)
def test_weights_after_one_step_match_one_device(tp, pp, dp, sp, zero, schedule, recompute):
    summary = run(tp, pp, dp, sp, zero, schedule, recompute)
    assert summary["numerics_max_rel_err"] < 1e-10
    assert summary["numerics"]["loss"] == pytest.approx(summary["numerics"]["reference_loss"], rel=1e-12)


# ZeRO 3 gathers one layer at a time by default (the cases above); here units of 2 and of 3 layers
# (3 does not divide 4: a short last unit, or the stage whole with pp = 2) gathered 0 or 2 ahead
UNIT_CASES = [
    (tp, sp, pp, unit, prefetch, schedule, recompute)
    for tp, sp in ((1, False), (2, True))
    for pp in (1, 2)
    for unit, prefetch in ((2, 0), (3, 2))
    for schedule, recompute in (("1f1b", "full"), ("interleaved", "none"), ("zb-h1", "none"))
]


@pytest.mark.parametrize("tp,sp,pp,unit,prefetch,schedule,recompute", UNIT_CASES)
def test_zero3_units_match_one_device(tp, sp, pp, unit, prefetch, schedule, recompute):
    more = f", zero3_unit_layers: {unit}, zero3_prefetch: {prefetch}"
    summary = run(tp, pp, 2, sp, 3, schedule, recompute, more)
    assert summary["numerics_max_rel_err"] < 1e-10
    assert summary["numerics"]["loss"] == pytest.approx(summary["numerics"]["reference_loss"], rel=1e-12)


MOE_SCENARIO = (
    SCENARIO.replace(
        "vocab: 32000}}",
        "vocab: 32000, moe: {{experts: 8, top_k: {top_k}, every: 2, "
        "expert_ffn: 2048, shared_experts: {shared}, capacity_factor: {capacity}}}}}",
    )
    .replace("zero: {zero},", "zero: {zero}, ep: {ep},")
    .replace("lr: 0.01}}", "lr: 0.01, hot_expert_bias: {bias}}}")
    .replace("{more}", "")
)

# (pp, dp, ep, top_k, capacity factor, shared experts, zero); capacity 0.5 drops tokens in every
# layer (C = ceil(0.5 x 16 tokens x k / 8) rows per expert); dp > ep gives each expert several holders
MOE_CASES = [
    (1, 1, 1, 1, None, 0, 0),
    (2, 1, 1, 2, None, 0, 0),
    (2, 2, 1, 2, None, 1, 1),
    (1, 2, 1, 1, None, 1, 1),
    (2, 2, 1, 2, 0.5, 0, 2),
    (1, 2, 2, 1, None, 0, 0),
    (2, 2, 2, 2, 0.5, 1, 1),
    (1, 4, 2, 2, None, 0, 2),
    (2, 4, 2, 1, 0.5, 0, 0),
    (1, 4, 4, 2, 0.5, 1, 0),
    (2, 4, 4, 1, None, 0, 1),
    (1, 8, 4, 1, 1.0, 0, 2),
]
# (tp, sequence parallel, then as above): each tensor-parallel rank routes 16 / tp of a
# microbatch's tokens through whole experts (C = ceil(0.5 x 16/tp x k / 8) with capacity 0.5)
MOE_TP_CASES = [
    (2, False, 1, 1, 1, 1, None, 0, 0),
    (2, True, 2, 1, 1, 2, 0.5, 1, 0),
    (2, False, 2, 2, 1, 2, None, 0, 1),
    (2, True, 1, 2, 2, 1, 0.5, 0, 0),
    (2, False, 1, 2, 2, 2, 0.5, 1, 2),
    (2, True, 2, 2, 2, 2, None, 0, 2),
    (2, False, 1, 4, 2, 1, None, 1, 1),
    (2, True, 1, 4, 4, 2, 1.0, 0, 1),
    (4, True, 1, 2, 2, 2, 0.5, 1, 1),
]


def moe_run(pp, dp, ep, top_k, capacity, shared, zero, bias=0.0, numerics=True, tp=1, sp=False, schedule="1f1b"):
    text = MOE_SCENARIO.format(
        gpus=tp * pp * dp,
        global_batch=2 * pp * dp,
        recompute="none",
        tp=tp,
        pp=pp,
        dp=dp,
        ep=ep,
        virtual=2 if SCHEDULES[schedule].chunks_per_rank else 1,
        zero=zero,
        sp=str(sp).lower(),
        schedule=schedule,
        top_k=top_k,
        shared=shared,
        capacity="null" if capacity is None else capacity,
        bias=bias,
    )
    text = text.replace("numerics: {", f"numerics: {{enabled: {str(numerics).lower()}, ")
    return simulate(load_scenario_text(text, "moe.yaml"))


@pytest.mark.parametrize(
    "tp,sp,pp,dp,ep,top_k,capacity,shared,zero", [(1, False, *case) for case in MOE_CASES] + MOE_TP_CASES
)
def test_moe_layers_match_one_device(tp, sp, pp, dp, ep, top_k, capacity, shared, zero):
    """The shadow model's MoE layers (every second layer, 8 experts, Switch top-1 or Mixtral-style
    renormalised top-2, with and without a shared expert and token dropping), pipelined, data- and
    tensor-parallel (sequence parallel on and off), with the tokens travelling to their experts'
    ranks by the engine's all-to-alls."""
    summary = moe_run(pp, dp, ep, top_k, capacity, shared, zero, tp=tp, sp=sp).summary
    assert summary["numerics_max_rel_err"] < 1e-10
    assert summary["numerics"]["loss"] == pytest.approx(summary["numerics"]["reference_loss"], rel=1e-12)


def experts_piece_seconds(result, rank: int) -> float:
    """Seconds `rank` spent in its experts pieces (tp_stage_plan names each piece's work items)."""
    sc = result.scenario
    experts = set()
    for op in result.program.ops[rank]:
        if isinstance(op, Compute) and op.part is not None:
            plan = tp_stage_plan(
                op.phase,
                stage_moe_layers(sc, op.stage),
                op.stage == 0,
                op.stage == sc.parallel.num_stages - 1,
                False,
                tp=1,
                ep=sc.parallel.ep,
            )
            if plan[op.part][0] == (f"{op.phase}.experts",):
                experts.add(op.label)
    assert experts
    return sum(s.end_s - s.start_s for s in result.log.spans if s.rank == rank and s.label in experts)


def test_a_skewed_router_makes_the_hot_experts_rank_the_straggler():
    """A selection bias on expert 0 sends it most rows. Each experts piece then lasts the cost model's
    time x the rows it really got / an even share, so the two EP ranks' expert time is in the ratio
    of their experts' rows (counted by the single-device reference's routing), and rank 0, which
    holds expert 0, arrives last at the all-to-alls that follow its experts."""
    result = moe_run(pp=1, dp=2, ep=2, top_k=1, capacity=None, shared=0, zero=0, bias=0.02)
    numerics = result.summary["numerics"]
    assert result.summary["numerics_max_rel_err"] < 1e-10
    rows = numerics["tokens_per_expert"]
    assert numerics["hottest_expert"] == 0 and numerics["hottest_expert_share"] > 0.5
    rank_rows = [sum(rows[e] for e in experts_of_rank(r, 8, 2)) for r in range(2)]
    seconds = [experts_piece_seconds(result, r) for r in range(2)]
    assert seconds[0] / seconds[1] == pytest.approx(rank_rows[0] / rank_rows[1], rel=1e-9)
    assert result.summary["alltoall_straggler_rank"] == 0
    line = next(line for line in terminal_summary(result).splitlines() if line.startswith("routing"))
    assert f"expert 0 took {100 * numerics['hottest_expert_share']:.1f} % of 128 rows" in line  # 2 x 4 groups x 16
    assert "rank 0 reached" in line and "(the straggler)" in line


def test_without_a_bias_the_rank_with_more_rows_is_the_straggler():
    """The initialised router is uneven too, less so: the expert times are again in the ratio of
    rows, and the straggler is whichever rank's experts got more."""
    result = moe_run(pp=1, dp=2, ep=2, top_k=2, capacity=None, shared=0, zero=0)
    rows = result.summary["numerics"]["tokens_per_expert"]
    rank_rows = [sum(rows[e] for e in experts_of_rank(r, 8, 2)) for r in range(2)]
    seconds = [experts_piece_seconds(result, r) for r in range(2)]
    assert seconds[0] / seconds[1] == pytest.approx(rank_rows[0] / rank_rows[1], rel=1e-9)
    assert result.summary["alltoall_straggler_rank"] == int(np.argmax(rank_rows))


# The schedules that split backwards (B: input gradient, W: weight gradient, accumulated only when
# W runs) and looped BFS, through pipeline 1, 2 (V placement for zbv and dualpipev), data parallel
# 1, 2 with ZeRO 0 and 3, tensor parallel 1 and 2 (sequence parallel on and off).
NEW_SCHEDULES = ("zb-h1", "interleaved-zb", "zbv", "dualpipev", "looped-bfs")
SPLIT_CASES = [
    (tp, pp, dp, sp, zero, schedule, recompute)
    for schedule in NEW_SCHEDULES
    for tp, sp in ((1, False), (2, False), (2, True))
    for pp, dp in itertools.product((1, 2), (1, 2))
    for zero in ((0, 3) if dp > 1 else (0,))
    for recompute in (("none", "full") if (pp, dp) == (2, 1) else ("none",))
]


@pytest.mark.parametrize("tp,pp,dp,sp,zero,schedule,recompute", SPLIT_CASES)
def test_split_backward_schedules_match_one_device(tp, pp, dp, sp, zero, schedule, recompute):
    summary = run(tp, pp, dp, sp, zero, schedule, recompute)
    assert summary["numerics_max_rel_err"] < 1e-10
    assert summary["numerics"]["loss"] == pytest.approx(summary["numerics"]["reference_loss"], rel=1e-12)


@pytest.mark.parametrize(
    "schedule,tp,sp,pp,dp,ep",
    [(s, 1, False, 2, 2, 2) for s in NEW_SCHEDULES] + [(s, 2, True, 2, 2, 2) for s in ("zb-h1", "zbv", "dualpipev")],
)
def test_split_backward_schedules_with_experts_match_one_device(schedule, tp, sp, pp, dp, ep):
    """MoE layers (top-2, capacity 0.5: dropped tokens) with their all-to-alls in B, their expert
    gradients added at W and reduced over the experts' holders after it."""
    summary = moe_run(pp, dp, ep, 2, 0.5, 1, 1, tp=tp, sp=sp, schedule=schedule).summary
    assert summary["numerics_max_rel_err"] < 1e-10
