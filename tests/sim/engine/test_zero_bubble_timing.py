"""Zero-bubble, DualPipeV and looped-BFS schedules timed by the real engine with equal F, B, W times
and free communication, against the closed forms of their papers; peak activations through the
memory timeline (sim.results.memory) against the papers' figures."""

import pytest
import simpy

from clustersim.schedules.pipeline import build_program, placement, rank_order
from clustersim.schedules.validate import validate
from clustersim.sim.engine.loop import run_program
from clustersim.sim.network.network import Network
from clustersim.sim.results.memory import memory_peaks, memory_timeline
from clustersim.sim.results.metrics import step_time_s
from clustersim.topologies.switch import switch

T = 1.0  # F = B = W = T for a whole stage (a chunk of v per rank: T / v each)
SHAPES = [(p, m) for p in (2, 3, 4, 8) for m in (p, 2 * p, 4 * p, 8 * p)]
V_SHAPES = [(p, m) for p, m in SHAPES if m >= 2 * p - 1]  # ZB-V fills its V from 2p - 1 microbatches


def timed(kind: str, p: int, m: int, v: int):
    """The engine's log of `kind` with F = T/v, whole backward 2T/v split into B = W = T/v, zero bytes
    and zero latency on the wire."""
    program = build_program(
        rank_order(kind, p, m, v),
        m,
        placement(kind, p, v),
        0.0,
        forward_flops=lambda s: T / v,
        backward_flops=lambda s: 2 * T / v,
        weight_flops=lambda s: T / v,
    )
    validate(program)
    return run_program(program, Network(simpy.Environment(), switch(p, 1e9, 0.0)), compute_time_s=lambda op: op.flops)


def bubble(kind: str, p: int, m: int, v: int) -> float:
    """Step time beyond the busy time m (F + B + W) of a rank."""
    return step_time_s(timed(kind, p, m, v)) - m * 3 * T


@pytest.mark.parametrize("p,m", SHAPES + [(4, 9), (3, 7), (8, 11)])
def test_zb_h1_bubble_is_a_third_of_1f1bs(p, m):
    """Qi et al. 2023 sec 2.1: 1F1B's bubble (p - 1)(F + B + W), ZB-H1's (p - 1)(F + B - W)."""
    assert bubble("1f1b", p, m, 1) == pytest.approx((p - 1) * 3 * T, abs=1e-9)
    assert bubble("zb-h1", p, m, 1) == pytest.approx((p - 1) * (T + T - T), abs=1e-9)


@pytest.mark.parametrize("p,m", V_SHAPES)
def test_zbv_bubble_is_one_chunk_forward_per_hop_and_vanishes_with_m(p, m):
    """ZB-V (Qi et al. 2023 sec 6; sail-sg's table: bubble rate 0 for F = B = W): the only idle
    time is the fill, the last rank waiting for p - 1 chunk forwards (F / 2 each); it does not
    grow with m, so the bubble rate (p - 1) / (6 m) tends to zero. With m >= 2p - 1 microbatches
    (PyTorch plans that many so the V fills)."""
    assert bubble("zbv", p, m, 2) == pytest.approx((p - 1) * T / 2, abs=1e-9)


def test_zbv_bubble_rate_is_near_zero_for_enough_microbatches():
    p, m = 8, 128
    assert bubble("zbv", p, m, 2) / (m * 3 * T) < 0.01 < bubble("1f1b", p, m, 1) / (m * 3 * T)


def peak_activations(kind: str, p: int, m: int, v: int, chunk_bytes: float) -> list[float]:
    """Each rank's activation peak with `chunk_bytes` per (microbatch, stage) held."""
    where = placement(kind, p, v)
    log = timed(kind, p, m, v)
    activation = {r: {s: chunk_bytes for s, rank in where.items() if rank == r} for r in range(p)}
    peaks = memory_peaks(memory_timeline(log, {}, activation))
    return [peaks[str(r)]["activations"] for r in range(p)]


@pytest.mark.parametrize("p,m", SHAPES)
def test_zb_h1_holds_p_microbatches_like_1f1bs_rank_0(p, m):
    """Qi et al. 2023 sec 2.1: no more than 1F1B's peak, p microbatches (p M_B), on any rank;
    counting a microbatch until its W ends, every rank reaches it (the paper: 'the same number of
    in-flight microbatches' on all stages)."""
    assert peak_activations("zb-h1", p, m, 1, 1.0) == [float(min(p, m))] * p


@pytest.mark.parametrize("p,m", V_SHAPES)
def test_zbv_holds_1f1bs_peak_on_every_rank(p, m):
    """Qi et al. 2023 sec 6: ZB-V's peak is 1F1B's, p M_B, balanced across workers: 2p chunk-
    microbatches of half a stage's activations each."""
    assert peak_activations("zbv", p, m, 2, 0.5) == [float(p)] * p


@pytest.mark.parametrize("p,m", [(p, m) for p, m in SHAPES if m >= 2 * p])
def test_dualpipev_holds_pp_plus_one_chunks(p, m):
    """DualPipe's README (github.com/deepseek-ai/DualPipe): DualPipeV holds PP + 1 activations per
    device, PP = 2p stages, each a chunk-microbatch."""
    assert peak_activations("dualpipev", p, m, 2, 1.0) == [float(2 * p + 1)] * p


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 5, 3)])
def test_looped_bfs_holds_every_microbatch_of_every_chunk(p, m, v):
    """Breadth-first: every forward of every chunk runs before the first backward, so a rank holds
    all v m chunk-microbatches at once (Lamy-Poirier 2022: the memory cost of breadth-first)."""
    assert peak_activations("looped-bfs", p, m, v, 1.0) == [float(v * m)] * p


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16)])
def test_looped_bfs_with_one_chunk_is_gpipes_makespan(p, m):
    """v = 1: all forwards then all backwards, as GPipe: (m + p - 1)(F + whole backward)."""
    assert step_time_s(timed("looped-bfs", p, m, 1)) == pytest.approx((m + p - 1) * 3 * T, abs=1e-9)
