"""The validator accepts every generated schedule and names the first broken rule of a bad one."""

import itertools
from dataclasses import replace

import pytest

from clustersim.schedules.ir import Compute, Recv, Send
from clustersim.schedules.pipeline import SCHEDULES, ScheduleError, build_program, placement, rank_order
from clustersim.schedules.validate import ProgramError, validate


def program(kind="1f1b", p=4, m=4, v=1):
    return build_program(
        rank_order(kind, p, m, v),
        m,
        placement(kind, p, v),
        64.0,
        forward_flops=lambda s: 1.0,
        backward_flops=lambda s: 2.0,
        weight_flops=lambda s: 1.0,
    )


def index_of(prog, rank, label):
    return next(i for i, op in enumerate(prog.ops[rank]) if op.label == label)


@pytest.mark.parametrize("kind", sorted(SCHEDULES))
def test_accepts_every_generated_schedule(kind):
    for p, m, v in itertools.product(range(1, 9), range(1, 17), range(1, 4)):
        try:
            SCHEDULES[kind].check(kind, p, m, v)
        except ScheduleError:
            continue
        validate(program(kind, p, m, v))


def test_accepts_interleaved_over_a_grid_of_p_v_m():
    for p, v in itertools.product(range(1, 7), range(1, 5)):
        microbatches = range(p, 4 * p + 1, p) if v > 1 else range(1, 4 * p + 1)  # v > 1: multiples of p
        for m in microbatches:
            validate(program("interleaved", p, m, v))


def test_interleaved_rejects_microbatches_not_a_multiple_of_pp():
    message = r"^interleaved schedule needs microbatches \(6\) to be a multiple of pp \(4\)$"
    with pytest.raises(ValueError, match=message):
        rank_order("interleaved", 4, 6, 2)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_one_stage_per_rank_schedules_reject_virtual_chunks(kind):
    with pytest.raises(ValueError, match=rf"schedule '{kind}' runs one stage per rank: virtual must be 1, got 2"):
        rank_order(kind, 4, 8, 2)


@pytest.mark.parametrize(
    "kind,p,m,v,knob",
    [("1f1b", 4, 8, 2, "virtual"), ("interleaved", 4, 6, 2, "microbatches"), ("interleaved", 4, 8, 0, "virtual")],
)
def test_a_schedules_sizes_rule_names_the_knob_at_fault(kind, p, m, v, knob):
    with pytest.raises(ScheduleError) as caught:
        SCHEDULES[kind].check(kind, p, m, v)
    assert caught.value.knob == knob


@pytest.mark.parametrize(
    "kind,p,v,fewest",
    [
        ("gpipe", 4, 1, 1),
        ("1f1b", 8, 1, 1),
        ("interleaved", 4, 1, 1),
        ("interleaved", 4, 2, 4),
        ("zbv", 4, 2, 1),
        ("dualpipev", 4, 2, 8),  # at least as many microbatches as stages, 2 pp
    ],
)
def test_fewest_microbatches_is_the_smallest_the_sizes_rule_accepts(kind, p, v, fewest):
    assert SCHEDULES[kind].fewest_microbatches(kind, p, v) == fewest
    validate(program(kind, p, fewest, v))


def test_unknown_schedule_lists_the_valid_names():
    with pytest.raises(
        ValueError,
        match=r"unknown schedule 'zigzag' \(valid: gpipe, 1f1b, interleaved, zb-h1, interleaved-zb, zbv, dualpipev, "
        r"looped-bfs\)",
    ):
        rank_order("zigzag", 4, 8)


def test_rejects_interleaved_chunk_that_skips_its_previous_chunk():
    """p = 2, v = 2: stage 2 (rank 0's chunk 1) consumes stage 1's output from rank 1."""
    prog = program("interleaved", p=2, m=2, v=2)
    i = index_of(prog, 0, "F0@2")
    prog.ops[0][i] = replace(prog.ops[0][i], deps=())
    with pytest.raises(ProgramError, match=rf"rank 0, op {i} \(F0@2\): does not wait for the activation F0@1"):
        validate(prog)


def test_rejects_backward_before_its_forward():
    prog = program()
    ops = prog.ops[3]
    f, b = index_of(prog, 3, "F2@3"), index_of(prog, 3, "B2@3")
    ops[f], ops[b] = ops[b], ops[f]
    with pytest.raises(ProgramError, match=rf"rank 3, op {f} \(B2@3\): backward before its forward"):
        validate(prog)


def test_rejects_send_to_the_wrong_stage():
    prog = program()
    i = index_of(prog, 0, "SEND F1@0")
    prog.ops[0][i] = replace(prog.ops[0][i], peer=2)
    with pytest.raises(
        ProgramError,
        match=rf"rank 0, op {i} \(SEND F1@0\): sends to rank 2, but stage 1 "
        r"that consumes F1@0 is on rank 1",
    ):
        validate(prog)


def test_rejects_forward_that_does_not_wait_for_its_activation():
    prog = program()
    i = index_of(prog, 2, "F1@2")
    prog.ops[2][i] = replace(prog.ops[2][i], deps=())
    with pytest.raises(ProgramError, match=rf"rank 2, op {i} \(F1@2\): does not wait for the activation F1@1"):
        validate(prog)


def test_rejects_unmatched_receive():
    prog = program()
    i = index_of(prog, 0, "SEND F3@0")
    del prog.ops[0][i]
    j = index_of(prog, 1, "RECV F3@0")
    with pytest.raises(ProgramError, match=rf"rank 1, op {j} \(RECV F3@0\): rank 0 never sends it"):
        validate(prog)


def test_rejects_size_mismatch():
    prog = program()
    i = index_of(prog, 1, "RECV F0@0")
    prog.ops[1][i] = replace(prog.ops[1][i], nbytes=32.0)
    with pytest.raises(
        ProgramError, match=r"rank 0, op \d+ \(SEND F0@0\): sends 64.0 B but rank 1 op \d+ receives 32.0 B"
    ):
        validate(prog)


def test_rejects_missing_microbatch():
    prog = program()
    prog.ops[1] = [op for op in prog.ops[1] if not (isinstance(op, Compute) and op.label == "F3@1")]
    with pytest.raises(ProgramError, match=r"F3@1"):
        validate(prog)


def test_rejects_duplicate_compute():
    prog = program(p=2, m=2)
    prog.ops[1].insert(0, Compute("F", 5, 1))
    with pytest.raises(ProgramError, match=r"rank 1, op 0 \(F5@1\): microbatch outside 0..1"):
        validate(prog)


def test_rejects_compute_on_the_wrong_rank():
    prog = program(p=2, m=1)
    prog.ops[0].append(Compute("F", 0, 1))
    with pytest.raises(ProgramError, match=r"rank 0, op \d+ \(F0@1\): stage 1 belongs to rank 1"):
        validate(prog)


def test_detects_deadlock_and_names_the_waiters():
    # Rank 0 receives B0@1 before it sends F0@0 on the same stream: a cycle through rank 1.
    prog = program(p=2, m=1)
    send = next(op for op in prog.ops[0] if isinstance(op, Send))
    recv = next(op for op in prog.ops[0] if isinstance(op, Recv))
    prog.ops[0] = [replace(op, stream="p2p") if isinstance(op, (Send, Recv)) else op for op in prog.ops[0]]
    i, j = prog.ops[0].index(replace(send, stream="p2p")), prog.ops[0].index(replace(recv, stream="p2p"))
    prog.ops[0][i], prog.ops[0][j] = prog.ops[0][j], prog.ops[0][i]
    with pytest.raises(
        ProgramError,
        match=r"^deadlock: .*rank 0, op \d+ \(RECV B0@1\) on stream p2p waits for "
        r"SEND B0@1 on rank 1",
    ):
        validate(prog)
