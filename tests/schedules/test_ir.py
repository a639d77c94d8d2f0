"""Ops and programs round-trip through their text form."""

import pytest

from clustersim.schedules.ir import Collective, Compute, Recv, Send, format_op, parse_op, parse_program
from clustersim.schedules.pipeline import build_program, rank_order


@pytest.mark.parametrize(
    "op",
    [
        Compute("F", 3, 1),
        Compute("B", 0, 7, 1.5e12, deps=("RECV B0@8",)),
        Compute("OPT", None, 2, nbytes=3.0e9),
        Compute("F", 1, 0, 2e12, 5e9),
        Send(2, ("F", 3, 1), 4096.0, deps=("F3@1",)),
        Recv(0, ("B", 11, 0), 1e6, stream="p2p"),
        Collective("all_reduce", "grads@1.b0", (1, 5), 1048576.0, "ring", deps=("B7@1",)),
        Collective("all_gather", "params@0", (0, 2, 4, 6), 3e9),
    ],
)
def test_op_round_trips(op):
    assert parse_op(format_op(op)) == op


def test_text_form_reads_well():
    assert format_op(Send(2, ("F", 3, 1), 4096.0, deps=("F3@1",))) == "send: SEND F3@1 ->2 4096.0B after F3@1"
    assert (
        format_op(Collective("all_reduce", "grads@1.b0", (1, 5), 1024.0, deps=("B7@1",)))
        == "dp: ALL_REDUCE grads@1.b0 [1,5] 1024.0B auto after B7@1"
    )


def test_program_round_trips():
    prog = build_program(rank_order("1f1b", 3, 5), 5, {0: 0, 1: 1, 2: 2}, 128.0, lambda s: 1e9, lambda s: 2e9)
    again = parse_program(prog.to_text(), 3, 5, prog.stage_to_rank)
    assert again.ops == prog.ops


@pytest.mark.parametrize("text", ["compute F3@1", "compute: X3@1", "send: SEND F3@1 <-2 1.0B"])
def test_parse_rejects_bad_text(text):
    with pytest.raises(ValueError, match="op text"):
        parse_op(text)
