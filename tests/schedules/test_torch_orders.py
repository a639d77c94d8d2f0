"""Each new schedule's per-rank compute order equals the order PyTorch's pipelining runtime executes
(fixtures written by tests/schedules/make_torch_orders.py from torch's own schedule classes), and
the validator holds its W's to their rules."""

import json
from pathlib import Path

import pytest

from clustersim.schedules.ir import Compute, Phase
from clustersim.schedules.pipeline import build_program, placement, rank_order
from clustersim.schedules.validate import ProgramError, validate

FIXTURES = Path(__file__).with_name("torch_orders")
KINDS = ("zb-h1", "interleaved-zb", "zbv", "dualpipev", "looped-bfs")


def shapes(kind):
    fixture = json.loads((FIXTURES / f"{kind}.json").read_text())
    assert fixture["source"].startswith("torch ")
    return [
        pytest.param(kind, s, id=f"{kind}-pp{s['pp']}-v{s['virtual']}-m{s['microbatches']}") for s in fixture["shapes"]
    ]


@pytest.mark.parametrize("kind,shape", [case for kind in KINDS for case in shapes(kind)])
def test_order_equals_the_pytorch_runtimes(kind, shape):
    order = rank_order(kind, shape["pp"], shape["microbatches"], shape["virtual"])
    ours = {str(rank): [[str(phase), mb, stage] for phase, mb, stage in steps] for rank, steps in order.items()}
    assert ours == shape["ranks"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_has_at_least_three_fixture_shapes(kind):
    assert len({(s.values[1]["pp"], s.values[1]["virtual"], s.values[1]["microbatches"]) for s in shapes(kind)}) >= 3


def test_v_placement_puts_the_turn_and_both_ends_on_the_right_ranks():
    # PyTorch's generate_stage_to_rank_mapping(4, 8, style="v"): 0 1 2 3 3 2 1 0
    assert placement("zbv", 4, 2) == {0: 0, 1: 1, 2: 2, 3: 3, 4: 3, 5: 2, 6: 1, 7: 0}


def test_the_turn_of_a_v_hands_over_locally():
    prog = build_program(
        rank_order("zbv", 2, 4, 2),
        4,
        placement("zbv", 2, 2),
        8.0,
        lambda s: 1.0,
        lambda s: 2.0,
        weight_flops=lambda s: 1.0,
    )
    validate(prog)
    labels = [op.label for op in prog.ops[1]]
    assert "RECV F0@1" not in labels and "SEND F0@1" not in labels  # stages 1 and 2 share rank 1
    assert "SEND F0@0" in [op.label for op in prog.ops[0]] and "RECV F0@2" in [op.label for op in prog.ops[0]]


def test_split_backward_costs_sum_to_the_whole_backward():
    prog = build_program(
        rank_order("zb-h1", 2, 2, 1),
        2,
        placement("zb-h1", 2, 1),
        8.0,
        lambda s: 1.0,
        lambda s: 3.0,
        weight_flops=lambda s: 1.0,
    )
    flops = {op.label: op.flops for ops in prog.ops.values() for op in ops if isinstance(op, Compute)}
    assert (flops["B0@0"], flops["W0@0"]) == (2.0, 1.0)


def test_an_order_with_w_needs_weight_flops():
    with pytest.raises(ValueError, match="needs weight_flops"):
        build_program(rank_order("zb-h1", 2, 2, 1), 2, placement("zb-h1", 2, 1), 8.0, lambda s: 1.0, lambda s: 2.0)


def zb_h1_program():
    """ZB-H1 on 2 ranks, 2 microbatches: F = W = 1, whole backward 2."""
    return build_program(
        rank_order("zb-h1", 2, 2, 1),
        2,
        placement("zb-h1", 2, 1),
        8.0,
        lambda s: 1.0,
        lambda s: 2.0,
        weight_flops=lambda s: 1.0,
    )


def moved(prog, rank, label, to):
    ops = prog.ops[rank]
    op = next(op for op in ops if op.label == label)
    ops.remove(op)
    ops.insert(to(ops), op)
    return prog


def test_rejects_a_w_before_its_backward():
    prog = zb_h1_program()
    moved(prog, 1, "W0@1", lambda ops: next(i for i, op in enumerate(ops) if op.label == "B0@1"))
    with pytest.raises(ProgramError, match=r"rank 1, op \d+ \(W0@1\): W before its backward or after OPT@1"):
        validate(prog)


def test_rejects_a_w_after_the_optimizer_step():
    prog = zb_h1_program()
    moved(prog, 1, "W1@1", len)
    with pytest.raises(ProgramError, match=r"\(W1@1\): W before its backward or after OPT@1"):
        validate(prog)


def test_rejects_a_w_run_twice():
    prog = zb_h1_program()
    prog.ops[0].insert(-1, Compute(Phase.W, 0, 0, 1.0, part=None))
    with pytest.raises(ProgramError, match="label used twice"):
        validate(prog)
