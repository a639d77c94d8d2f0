"""Data parallel and ZeRO collectives: bytes each rank sends per step, measured from the event
log, against the ZeRO paper's communication volumes (Rajbhandari et al. 2020, section 7)."""

import dataclasses

import pytest
import simpy

from clustersim.schedules.data_parallel import add_data_parallel, bucket_sizes
from clustersim.schedules.ir import Collective, Program
from clustersim.schedules.layout import Layout
from clustersim.schedules.pipeline import build_program, rank_order, stage_ranks
from clustersim.schedules.validate import ProgramError, validate
from clustersim.sim.engine.loop import run_program
from clustersim.sim.network.network import Network
from clustersim.topologies.switch import switch

WEIGHT_BYTES = 400e6  # 16-bit weights (= gradients) of one stage on one rank


def dp_program(
    dp: int, pp: int, zero: int, m: int = 1, bucket_bytes: float = 100e6, grad_scale: float = 1.0
) -> Program:
    layout = Layout(dp=dp, pp=pp, tp=1)
    replicas = []
    for d in range(dp):
        local = build_program(
            rank_order("1f1b", pp, m),
            m,
            stage_ranks(pp),
            1e6,
            forward_flops=lambda s: 1e12,
            backward_flops=lambda s: 2e12,
            optimizer_bytes=lambda s: 1e9,
        )
        replicas.append(local.relabel(dict(enumerate(layout.pp_group(d, 0)))))
    program = add_data_parallel(
        Program.merge(replicas), layout, lambda s: WEIGHT_BYTES, zero, bucket_bytes, grad_scale=grad_scale
    )
    validate(program)
    return program


def bytes_sent_on_dp(program: Program, num_gpus: int) -> dict[int, float]:
    network = Network(simpy.Environment(), switch(num_gpus, 100e9, 1e-6))
    log = run_program(program, network, compute_time_s=lambda op: op.flops / 1e14 + op.nbytes / 2e12)
    sent = {rank: 0.0 for rank in range(num_gpus)}
    for flow in log.flows:
        if flow.label.startswith("dp:"):
            sent[flow.src] += flow.nbytes
    return sent


@pytest.mark.parametrize("zero", [0, 1, 2])
@pytest.mark.parametrize("dp", [2, 4])
def test_dp_and_zero_1_2_send_2_n_minus_1_over_n_of_the_gradients(dp, zero):
    sent = bytes_sent_on_dp(dp_program(dp, 2, zero), 2 * dp)
    for rank, nbytes in sent.items():
        assert nbytes == pytest.approx(2 * (dp - 1) / dp * WEIGHT_BYTES, rel=1e-9), rank


@pytest.mark.parametrize("dp", [2, 4])
def test_zero_3_sends_one_and_a_half_times_that(dp):
    sent = bytes_sent_on_dp(dp_program(dp, 2, 3), 2 * dp)
    for rank, nbytes in sent.items():
        assert nbytes == pytest.approx(1.5 * 2 * (dp - 1) / dp * WEIGHT_BYTES, rel=1e-9), rank


@pytest.mark.parametrize("zero,weight_moves,gradient_moves", [(0, 0, 2), (1, 1, 1), (2, 1, 1), (3, 2, 1)])
def test_fp32_gradients_double_the_reductions_and_leave_the_gathers(zero, weight_moves, gradient_moves):
    """FP32 gradients of 16-bit weights (grad_scale 2): each (N-1)/N pass over the gradients (an
    all-reduce's two, a reduce-scatter's one) moves 4 bytes a parameter, each pass over the weights
    (ZeRO's all-gathers: after the step, or ZeRO 3's before the forward and the backward) 2."""
    dp = 4
    sent = bytes_sent_on_dp(dp_program(dp, 2, zero, grad_scale=2.0), 2 * dp)
    want = (dp - 1) / dp * WEIGHT_BYTES * (weight_moves + 2 * gradient_moves)
    for rank, nbytes in sent.items():
        assert nbytes == pytest.approx(want, rel=1e-9), rank


def test_buckets_cover_the_gradients():
    assert bucket_sizes(250.0, 100.0) == [100.0, 100.0, 50.0]
    assert bucket_sizes(50.0, 100.0) == [50.0]


def test_gradient_collectives_wait_for_the_last_backward_and_the_step_for_them():
    program = dp_program(2, 2, 1, m=3)
    ops = program.ops[0]
    labels = [op.label for op in ops]
    first_rs = next(i for i, op in enumerate(ops) if isinstance(op, Collective) and op.kind == "reduce_scatter")
    assert ops[first_rs].deps == ("B2@0",) and labels.index("B2@0") < first_rs
    opt = ops[labels.index("OPT@0")]
    assert set(opt.deps) == {f"REDUCE_SCATTER grads@0.t0.b{b}" for b in range(4)}


def test_validator_rejects_a_member_that_never_joins():
    program = dp_program(2, 1, 0)
    program.ops[1] = [
        dataclasses.replace(op, deps=()) if op.label == "OPT@0" else op
        for op in program.ops[1]
        if not isinstance(op, Collective)
    ]
    with pytest.raises(
        ProgramError, match=r"rank 0, op \d+ \(ALL_REDUCE grads@0.t0.b0\): member rank 1 never joins it"
    ):
        validate(program)


def numerics_run(dp: int, pp: int, zero: int, m: int, buckets: int = 3, optimizer: str = "adam") -> dict:
    from clustersim.sim.numerics.data_parallel import DataParallelNumerics
    from clustersim.sim.numerics.plan import TrainingStep
    from clustersim.sim.numerics.transformer import ShadowConfig

    cfg = ShadowConfig(layers=2 * pp, hidden=8, heads=2, ffn=16, seq_len=5, vocab=11)
    layout = Layout(dp=dp, pp=pp, tp=1)
    program = dp_program(dp, pp, zero, m=m, bucket_bytes=WEIGHT_BYTES / buckets)
    numerics = DataParallelNumerics(
        cfg,
        [dict(enumerate(layout.pp_group(d, 0))) for d in range(dp)],
        TrainingStep(m, 2, seed=3, optimizer=optimizer, lr=0.01),
        zero=zero,
        buckets={("grads", s): buckets for s in range(pp)},
    )
    network = Network(simpy.Environment(), switch(dp * pp, 100e9, 1e-6))
    run_program(program, network, compute_time_s=lambda op: op.flops / 1e14 + op.nbytes / 2e12, numerics=numerics)
    return numerics.finish()


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("dp,pp", [(2, 1), (2, 2), (4, 1)])
def test_data_parallel_step_matches_one_device_on_the_global_batch(dp, pp, zero):
    result = numerics_run(dp, pp, zero, m=3)
    assert result["replicas"] == dp
    assert result["max_rel_err"] < 1e-10
    assert result["loss"] == pytest.approx(result["reference_loss"], rel=1e-12)


def test_a_wrong_shard_is_caught():
    """Give the optimizer step the wrong chunk: the comparison with one device must fail."""
    from clustersim.sim.numerics import data_parallel

    original = data_parallel.DataParallelNumerics._chunk

    def shifted(self, rank, what, lo, hi):
        a, b = original(self, rank, what, lo, hi)
        return (a + 1, b + 1) if b < hi else (a, b)

    data_parallel.DataParallelNumerics._chunk = shifted
    try:
        assert numerics_run(2, 1, 1, m=2)["max_rel_err"] > 1e-3
    finally:
        data_parallel.DataParallelNumerics._chunk = original


def test_a_nan_weight_is_an_infinite_error():
    import numpy as np

    from clustersim.sim.numerics.reference import max_errors

    assert max_errors({"w": np.array([np.nan, 1.0])}, {"w": np.array([1.0, 1.0])}) == (np.inf, np.inf)
