"""Pipeline schedules run by the engine match their closed forms."""

import itertools

import pytest
import simpy

from clustersim.schedules.pipeline import SCHEDULES, build_program, rank_order, stage_ranks
from clustersim.schedules.validate import validate
from clustersim.sim.engine.loop import run_program
from clustersim.sim.network.network import Network
from clustersim.sim.results.breakdown import message_departures, step_breakdown
from clustersim.sim.results.metrics import (
    bubble_ratio_per_rank,
    megatron_bubble_over_ideal_per_rank,
    peak_inflight_microbatches_per_rank,
    step_time_s,
)
from clustersim.topologies.switch import switch

FORWARD_S, BACKWARD_S = 1.0, 2.0  # equal stage times, backward = 2 x forward


def run_free_comm(kind: str, p: int, m: int, v: int = 1):
    """Equal stage times and free communication (zero bytes, zero latency); with v chunks per rank
    each chunk takes 1/v of a rank's forward and backward time."""
    program = free_comm_program(kind, p, m, v)
    network = Network(simpy.Environment(), switch(p, 1e9, 0.0))
    return run_program(program, network, compute_time_s=lambda op: op.flops)


def free_comm_program(kind: str, p: int, m: int, v: int = 1):
    """The validated program run_free_comm runs (compute ops' flops are their seconds)."""
    program = build_program(
        rank_order(kind, p, m, v),
        m,
        stage_ranks(p, v),
        0.0,
        forward_flops=lambda s: FORWARD_S / v,
        backward_flops=lambda s: BACKWARD_S / v,
    )
    validate(program)
    return program


@pytest.mark.parametrize("kind", sorted(k for k, entry in SCHEDULES.items() if not entry.splits_backward))
def test_bubble_ratio_is_p_minus_1_over_m_plus_p_minus_1(kind):
    """Schedules that do not split the backward, one stage per rank (looped BFS with v = 1 is GPipe
    with its backwards in reverse); zero bubble: tests/sim/engine/test_zero_bubble_timing.py."""
    for p, m in itertools.product(range(2, 9), range(1, 33)):
        log = run_free_comm(kind, p, m)
        expected = (p - 1) / (m + p - 1)
        for rank, ratio in enumerate(bubble_ratio_per_rank(log)):
            assert ratio == pytest.approx(expected, abs=1e-12), (kind, p, m, rank)
        # makespan of a flushed pipeline: (m + p - 1) x (t_F + t_B)
        assert step_time_s(log) == pytest.approx((m + p - 1) * (FORWARD_S + BACKWARD_S), abs=1e-9)


@pytest.mark.parametrize("v", [1, 2, 3, 4])
def test_interleaved_bubble_is_p_minus_1_over_v_m_plus_p_minus_1(v):
    """Chunks of t_F / v and t_B / v: fill and drain cost (p - 1)(t_F + t_B) / v, the work
    m (t_F + t_B), so bubble = (p - 1) / (v m + p - 1) and makespan = (v m + p - 1)(t_F + t_B) / v."""
    for p in range(2, 7):
        for m in range(p, 4 * p + 1, p):
            log = run_free_comm("interleaved", p, m, v)
            expected = (p - 1) / (v * m + p - 1)
            for rank, ratio in enumerate(bubble_ratio_per_rank(log)):
                assert ratio == pytest.approx(expected, abs=1e-12), (p, v, m, rank)
            assert step_time_s(log) == pytest.approx((v * m + p - 1) * (FORWARD_S + BACKWARD_S) / v, abs=1e-9)


@pytest.mark.parametrize(
    "kind,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 1), ("interleaved", 2), ("interleaved", 4)]
)
def test_megatron_bubble_over_ideal_is_p_minus_1_over_v_m(kind, v):
    """Narayanan et al. 2021, sec 2.2.1-2.2.2: bubble time fraction t_pb / t_id = (p - 1) / m, and
    (p - 1) / (v m) with v chunks; and with free communication and no optimizer cost, the bubble
    as a share of the step (the breakdown's) is (p - 1) / (v m + p - 1)."""
    for p in range(2, 7):
        for m in range(p, 3 * p + 1, p):
            log = run_free_comm(kind, p, m, v)
            for rank, over_ideal in enumerate(megatron_bubble_over_ideal_per_rank(log)):
                assert over_ideal == pytest.approx((p - 1) / (v * m), abs=1e-12), (kind, p, v, m, rank)
            sent_s = message_departures(free_comm_program(kind, p, m, v), log)
            fraction = step_breakdown(log, sent_s=sent_s).bubble_s / step_time_s(log)
            assert fraction.tolist() == pytest.approx([(p - 1) / (v * m + p - 1)] * p, abs=1e-12)


def test_interleaved_on_one_rank_hands_over_locally_with_no_bubble():
    """p = 1, v = 3: the three stages share rank 0, so there is nothing to wait for."""
    log = run_free_comm("interleaved", 1, 4, 3)
    assert bubble_ratio_per_rank(log) == [0.0]
    assert step_time_s(log) == pytest.approx(4 * (FORWARD_S + BACKWARD_S), abs=1e-12)


@pytest.mark.parametrize("p,m", [(2, 1), (4, 8), (4, 3), (8, 5), (8, 32), (5, 7)])
def test_gpipe_holds_every_microbatch_in_flight(p, m):
    assert peak_inflight_microbatches_per_rank(run_free_comm("gpipe", p, m)) == [m] * p


@pytest.mark.parametrize("p,m", [(2, 1), (4, 8), (4, 3), (8, 5), (8, 32), (5, 7)])
def test_1f1b_holds_p_minus_r_in_flight(p, m):
    assert peak_inflight_microbatches_per_rank(run_free_comm("1f1b", p, m)) == [min(p - r, m) for r in range(p)]


def test_engine_raises_on_deadlock_naming_what_each_stream_waits_for():
    """A cycle the validator would reject, run anyway: the engine must not end early with a
    short makespan; it names the blocked streams."""
    from clustersim.schedules.ir import Compute, Program, Recv, Send
    from clustersim.sim.engine.loop import DeadlockError

    ops = {
        0: [
            Recv(1, ("B", 0, 1), 0.0),
            Compute("F", 0, 0, 1.0, deps=("RECV B0@1",)),
            Send(1, ("F", 0, 0), 0.0, deps=("F0@0",)),
        ],
        1: [
            Recv(0, ("F", 0, 0), 0.0),
            Compute("B", 0, 1, 1.0, deps=("RECV F0@0",)),
            Send(0, ("B", 0, 1), 0.0, deps=("B0@1",)),
        ],
    }
    network = Network(simpy.Environment(), switch(2, 1e9, 0.0))
    with pytest.raises(
        DeadlockError,
        match=r"rank 0 compute: F0@0 waits for RECV B0@1.*rank 1 recv: RECV F0@0 "
        r"waits for SEND F0@0 from rank 0",
    ):
        run_program(Program(ops, 2, 1, {0: 0, 1: 1}), network, compute_time_s=lambda op: op.flops)


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 4), (3, 4, 9), (1, 3, 5), (4, 1, 3)])
def test_interleaved_holds_its_warmup_plus_one_chunks_in_flight(p, v, m):
    """Rank r holds its 2 (p - r - 1) + (v - 1) p warm-up forwards plus the steady state's one,
    counted per (microbatch, chunk), never more than all v m of them."""
    want = [min(2 * (p - r - 1) + (v - 1) * p + 1, v * m) for r in range(p)]
    assert peak_inflight_microbatches_per_rank(run_free_comm("interleaved", p, m, v)) == want


def test_progress_hook_counts_every_op_up_to_the_total():
    import clustersim.sim.engine.loop as engine

    program = build_program(
        rank_order("1f1b", 4, 64), 64, stage_ranks(4), 0.0, forward_flops=lambda s: 1.0, backward_flops=lambda s: 2.0
    )
    seen = []
    network = Network(simpy.Environment(), switch(4, 1e9, 0.0))
    run_program(program, network, compute_time_s=lambda op: op.flops, on_progress=seen.append)
    total = sum(len(ops) for ops in program.ops.values())
    assert seen == sorted(seen) and seen[-1] == total
    assert len(seen) >= total // engine.PROGRESS_EVERY
