"""Ops and programs round-trip through their text form."""

import pytest

from clustersim.schedules.data_parallel import add_data_parallel
from clustersim.schedules.ir import Collective, Compute, Phase, Program, Recv, Send
from clustersim.schedules.layout import Layout
from clustersim.schedules.pipeline import build_program, rank_order, stage_ranks
from clustersim.schedules.tags import (
    ExpertPiece,
    GradBucket,
    GradSync,
    ParamBucket,
    ParamGather,
    TensorPiece,
    parse_tag,
)
from clustersim.schedules.tensor_parallel import PieceCosts, TensorParallelPlan, add_tensor_parallel
from clustersim.schedules.text import format_op, parse_op, parse_program
from clustersim.schedules.validate import validate


@pytest.mark.parametrize(
    "op",
    [
        Compute(Phase.F, 3, 1),
        Compute(Phase.B, 0, 7, 1.5e12, deps=("RECV B0@8",)),
        Compute(Phase.OPT, None, 2, nbytes=3.0e9),
        Compute(Phase.F, 1, 0, 2e12, 5e9),
        Compute(Phase.W, 4, 1, 1e12),
        Compute(Phase.R, 4, 1, 1e12, part=2),
        Send(2, (Phase.F, 3, 1), 4096.0, deps=("F3@1",)),
        Recv(0, (Phase.B, 11, 0), 1e6, stream="p2p"),
        Collective("all_reduce", GradBucket(1, 0, 0), (1, 5), 1048576.0, "ring", deps=("B7@1",)),
        Collective("all_gather", ParamGather(0, 1, 2, "F3@0.0"), (0, 2, 4, 6), 3e9),
    ],
)
def test_op_round_trips(op):
    assert parse_op(format_op(op)) == op


def test_text_form_reads_well():
    assert format_op(Send(2, (Phase.F, 3, 1), 4096.0, deps=("F3@1",))) == "send: SEND F3@1 ->2 4096.0B after F3@1"
    assert (
        format_op(Collective("all_reduce", GradBucket(1, 0, 0), (1, 5), 1024.0, deps=("B7@1",)))
        == "dp: ALL_REDUCE grads@1.t0.b0 [1,5] 1024.0B auto after B7@1"
    )


@pytest.mark.parametrize(
    "tag,text",
    [
        (GradBucket(1, 0, 3), "grads@1.t0.b3"),
        (GradBucket(1, 0, 3, expert_rank=1), "egrads@1.t0.r1.b3"),
        (ParamBucket(1, 0, 3), "params@1.t0.b3"),
        (ParamBucket(1, 2, 3, expert_rank=1), "eparams@1.t2.r1.b3"),
        (ParamGather(1, 0, 2, "F3@1.4"), "params@1.t0.u2.F3@1.4"),
        (TensorPiece(0, "F3@1.2"), "tp@d0.F3@1.2"),
        (ExpertPiece(1, 0, 2, "B3@1.4"), "ep@p1.t0.g2.B3@1.4"),
        (GradSync(0, 1), "tp@d0.grads@1"),
    ],
)
def test_collective_tags_print_as_before_and_parse_back(tag, text):
    assert str(tag) == text
    assert parse_tag(text) == tag


def test_phases_print_as_their_letters():
    assert [str(p) for p in Phase] == ["F", "B", "W", "R", "OPT"]
    assert Compute(Phase.W, 2, 0).label == "W2@0"


def test_program_round_trips():
    prog = build_program(rank_order("1f1b", 3, 5), 5, {0: 0, 1: 1, 2: 2}, 128.0, lambda s: 1e9, lambda s: 2e9)
    again = parse_program(prog.to_text(), 3, 5, prog.stage_to_rank)
    assert again.ops == prog.ops


@pytest.mark.parametrize("zero,ep", [(1, 2), (3, 1)])  # ZeRO 3 with ep > 1 is not modelled
def test_a_program_with_every_kind_of_tag_round_trips(zero, ep):
    """Pipeline, tensor (sequence) parallel, expert parallel and data parallel / ZeRO passes: every
    tag they make prints and parses back to the same op."""
    layout = Layout(dp=4, pp=2, tp=2, ep=ep)
    pipeline = build_program(rank_order("1f1b", 2, 2), 2, stage_ranks(2), 64.0, lambda s: 1e9, lambda s: 2e9)
    replicas = [pipeline.relabel(dict(enumerate(layout.pp_group(d, t)))) for d in range(4) for t in range(2)]
    prog = add_tensor_parallel(
        Program.merge(replicas),
        layout,
        TensorParallelPlan(lambda s: [True, False], sequence_parallel=True, recompute_full=False),
        PieceCosts(lambda item, s: 1e6, 64.0, 8.0, lambda s: 16.0, alltoall_bytes=32.0, counts_bytes=8.0),
    )
    prog = add_data_parallel(prog, layout, lambda s: 1000.0, zero, 300.0, lambda s: 400.0 if ep > 1 else 0.0)
    validate(prog)
    kinds = {type(op.tag) for ops in prog.ops.values() for op in ops if isinstance(op, Collective)}
    expected = {TensorPiece, GradSync, GradBucket} | ({ParamBucket, ExpertPiece} if zero < 3 else {ParamGather})
    assert kinds == expected
    assert parse_program(prog.to_text(), 2, 2, prog.stage_to_rank).ops == prog.ops


@pytest.mark.parametrize(
    "text", ["compute F3@1", "compute: X3@1", "send: SEND F3@1 <-2 1.0B", "dp: ALL_REDUCE grads@1 [0,1] 1.0B auto"]
)
def test_parse_rejects_bad_text(text):
    with pytest.raises(ValueError, match="op text"):
        parse_op(text)
