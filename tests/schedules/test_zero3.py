"""ZeRO 3 unit by unit (schedules.zero3): where the stage ops are cut, what each gather and
reduce-scatter waits for, and the bytes a step moves against the ZeRO paper's 3 (N-1)/N Psi per
microbatch (Rajbhandari et al. 2020, section 7)."""

import pytest
import simpy

from clustersim.schedules.data_parallel import add_data_parallel
from clustersim.schedules.ir import Collective, Compute, Phase, Program
from clustersim.schedules.layout import Layout
from clustersim.schedules.pipeline import build_program, rank_order, stage_ranks
from clustersim.schedules.stage_pieces import UNIT_ITEM, tp_stage_plan, unit_starts
from clustersim.schedules.tensor_parallel import PieceCosts, TensorParallelPlan, add_tensor_parallel
from clustersim.schedules.validate import validate
from clustersim.schedules.zero3 import STREAM, unit_ranges
from clustersim.sim.engine.loop import run_program
from clustersim.sim.network.network import Network
from clustersim.topologies.switch import switch

LAYERS = 4
LAYER_BYTES = 100e6  # one layer's 16-bit weights on one rank
EMBED_BYTES, HEAD_BYTES = 30e6, 20e6


def test_unit_ranges_cut_a_stage_into_units_the_last_one_shorter():
    assert unit_ranges(range(4, 8), 1) == [range(4, 5), range(5, 6), range(6, 7), range(7, 8)]
    assert unit_ranges(range(0, 5), 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert unit_ranges(range(0, 4), None) == [range(0, 4)]
    with pytest.raises(ValueError, match="at least one layer, not 0"):
        unit_ranges(range(4), 0)


def test_without_tensor_parallelism_each_unit_is_a_piece():
    pieces = tp_stage_plan(Phase.F, 3, True, True, False, tp=1, unit_layers=1)
    assert [items for items, _, _ in pieces] == [
        ("F.embed", "F.attn", "F.mlp"),
        (UNIT_ITEM, "F.attn", "F.mlp"),
        (UNIT_ITEM, "F.attn", "F.mlp", "F.head"),
    ]
    assert all(kind is None for _, kind, _ in pieces) and unit_starts(pieces) == (0, 1, 2)


def test_a_recomputed_backward_runs_each_units_forward_just_before_its_backward():
    pieces = tp_stage_plan(Phase.B, 3, True, False, False, True, tp=1, unit_layers=2)
    assert [items for items, _, _ in pieces] == [
        ("F.attn", "F.mlp", "B.mlp", "B.attn"),  # unit 1: layer 2
        (UNIT_ITEM, "F.embed", "F.attn", "F.mlp", "F.attn", "F.mlp", "B.mlp", "B.attn", "B.mlp", "B.attn", "B.embed"),
    ]


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("phase", [Phase.F, Phase.B])
def test_with_tensor_parallelism_units_start_where_a_collective_already_cuts(phase, sp):
    whole = tp_stage_plan(phase, LAYERS, True, True, sp, tp=2)
    units = tp_stage_plan(phase, LAYERS, True, True, sp, tp=2, unit_layers=1)
    assert len(units) == len(whole)  # no new piece
    assert [tuple(i for i in items if i != UNIT_ITEM) for items, _, _ in units] == [items for items, _, _ in whole]
    starts = unit_starts(units)
    assert len(starts) == LAYERS and starts[0] == 0
    layer_item = "F.attn" if phase == Phase.F else "B.mlp"  # a layer's first work item
    for start in starts[1:]:  # each unit's first layer item is in its first piece, after any all-gather
        assert units[start][0][0] == UNIT_ITEM
        following = [items for items, _, _ in units[start:]]
        assert layer_item in next(items for items in following if len(items) > 1 or items[0] != UNIT_ITEM)


def unit_program(dp: int, m: int, unit_layers: int, prefetch: int = 1, schedule: str = "1f1b") -> Program:
    """One stage of LAYERS layers (the embedding and head on it), dp replicas, tensor parallel 1."""
    layout = Layout(dp=dp, pp=1, tp=1)
    split = schedule == "zb-h1"
    local = build_program(
        rank_order(schedule, 1, m),
        m,
        stage_ranks(1),
        1e6,
        forward_flops=lambda s: 4e12,
        backward_flops=lambda s: 8e12,
        optimizer_bytes=lambda s: 1e9,
        weight_flops=(lambda s: 4e12) if split else None,
    )
    replicas = [local.relabel(dict(enumerate(layout.pp_group(d, 0)))) for d in range(dp)]
    plan = TensorParallelPlan(lambda s: [False] * LAYERS, False, False, unit_layers)
    costs = PieceCosts(lambda item, s: 0.0 if item.endswith("embed") else 1e12, 1e6, 1e3, lambda s: 0.0)
    program = add_tensor_parallel(Program.merge(replicas), layout, plan, costs)
    ranges = unit_ranges(range(LAYERS), unit_layers)

    def unit_bytes(stage: int, unit: int) -> float:
        return (
            len(ranges[unit]) * LAYER_BYTES
            + (EMBED_BYTES if unit == 0 else 0.0)
            + (HEAD_BYTES if unit == len(ranges) - 1 else 0.0)
        )

    def starts(phase: Phase, stage: int, split: bool) -> tuple[int, ...]:
        return unit_starts(tp_stage_plan(phase, LAYERS, True, True, False, tp=1, unit_layers=unit_layers))

    program = add_data_parallel(program, layout, lambda s: 0.0, 3, 1e9, zero3_units=(unit_bytes, starts, prefetch))
    validate(program)
    return program


STAGE_BYTES = LAYERS * LAYER_BYTES + EMBED_BYTES + HEAD_BYTES


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_each_gather_waits_for_the_unit_prefetch_plus_one_uses_back(prefetch):
    program = unit_program(dp=2, m=2, unit_layers=1, prefetch=prefetch)
    ops = program.ops[0]
    gathers = [op for op in ops if isinstance(op, Collective) and op.kind == "all_gather"]
    # 2 microbatches x (forward + backward) x 4 units, in compute order: F units 0..3, B units 3..0
    assert len(gathers) == 2 * 2 * LAYERS
    assert [g.tag.unit for g in gathers[:8]] == [0, 1, 2, 3, 3, 2, 1, 0]
    pieces = [op for op in ops if isinstance(op, Compute) and op.phase in (Phase.F, Phase.B)]
    firsts = [g.tag.consumer for g in gathers]
    for j, g in enumerate(gathers):
        consumer = next(op for op in pieces if op.label == firsts[j])
        assert g.label in consumer.deps
        if j <= prefetch:
            assert g.deps == ()
        else:  # the end of use j - prefetch - 1: the piece before use j - prefetch starts
            before = pieces[[op.label for op in pieces].index(firsts[j - prefetch]) - 1]
            assert g.deps == (before.label,)
        # issued (stream order) when use j - prefetch starts, before that use's consumer piece
        assert ops.index(g) < ops.index(next(op for op in pieces if op.label == firsts[max(0, j - prefetch)]))


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_each_units_gradients_are_reduce_scattered_once_as_its_last_gradient_op_ends(schedule):
    program = unit_program(dp=2, m=3, unit_layers=2, schedule=schedule)
    ops = program.ops[0]
    reduces = [op for op in ops if isinstance(op, Collective) and op.kind == "reduce_scatter"]
    assert [r.tag.bucket for r in reduces] == [1, 0] and all(r.stream == STREAM for r in reduces)
    last = "W2@0" if schedule == "zb-h1" else None  # a W is whole: both units reduce after it
    expected = [(last,), (last,)] if last else [("B2@0.0",), ("B2@0.1",)]
    assert [r.deps for r in reduces] == expected
    assert [r.nbytes for r in reduces] == [2 * LAYER_BYTES + HEAD_BYTES, 2 * LAYER_BYTES + EMBED_BYTES]
    opt = next(op for op in ops if isinstance(op, Compute) and op.phase == Phase.OPT)
    assert set(opt.deps) == {r.label for r in reduces} and opt.nbytes == 1e9 / 2


@pytest.mark.parametrize("unit_layers", [1, 3, LAYERS])
@pytest.mark.parametrize("dp", [2, 4])
def test_a_step_sends_2m_plus_1_times_n_minus_1_over_n_of_the_weights(dp, unit_layers):
    """(N-1)/N Psi per gather of every unit and per reduce-scatter: 3 (N-1)/N Psi with one
    microbatch, (2m + 1)(N-1)/N Psi with m, whatever the unit size."""
    for m in (1, 2):
        program = unit_program(dp=dp, m=m, unit_layers=unit_layers)
        network = Network(simpy.Environment(), switch(dp, 100e9, 1e-6))
        log = run_program(program, network, compute_time_s=lambda op: op.flops / 1e14 + op.nbytes / 2e12)
        sent = {rank: 0.0 for rank in range(dp)}
        for flow in log.flows:
            sent[flow.src] += flow.nbytes
        for rank, nbytes in sent.items():
            assert nbytes == pytest.approx((2 * m + 1) * (dp - 1) / dp * STAGE_BYTES, rel=1e-9), (m, rank)
