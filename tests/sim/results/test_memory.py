"""Memory per rank: ZeRO model states and Korthikanti activations against the papers, and the
timeline (a pure function of the event log) on hand-made logs and on logs the engine produced."""

from __future__ import annotations

import json

import pytest
import simpy

from clustersim.schedules.pipeline import build_program, rank_order, stage_ranks
from clustersim.sim.cost.memory import activation_bytes_per_layer, model_state_bytes
from clustersim.sim.engine.loop import run_program
from clustersim.sim.engine.records import EventLog, Span
from clustersim.sim.network.network import Network
from clustersim.sim.results.memory import (
    CATEGORIES,
    capacity_message,
    memory_peaks,
    memory_timeline,
    ranks_over_capacity,
)
from clustersim.sim.results.metrics import peak_inflight_microbatches_per_rank
from clustersim.sim.views.memory import plot_memory, worst_ranks
from clustersim.topologies.switch import switch

GB = 1e9  # the ZeRO paper's GB is decimal

# --- model states: ZeRO (Rajbhandari et al. 2020) -------------------------------------------------


def total(states: dict[str, float]) -> float:
    return states["weights"] + states["gradients"] + states["optimizer"]


@pytest.mark.parametrize(
    "stage, printed_gb, digit", [(0, 120, 0.5), (1, 31.4, 0.05), (2, 16.6, 0.05), (3, 1.88, 0.005)]
)
def test_zero_model_states_match_the_papers_figure_1(stage, printed_gb, digit):
    """ZeRO paper, Figure 1: Psi = 7.5B, Nd = 64, K = 12 -> 120, 31.4, 16.6, 1.88 GB per device,
    printed to three significant figures (so within half a unit of the last printed digit)."""
    states = model_state_bytes(7.5e9, stage, 64)
    assert total(states) / GB == pytest.approx(printed_gb, abs=digit)


@pytest.mark.parametrize("psi, nd, k", [(7.5e9, 64, 12), (1.3e9, 8, 12), (123_456_789, 3, 8), (1e6, 1, 12)])
def test_zero_model_states_follow_the_papers_formulas(psi, nd, k):
    """(2+2+K)Psi; 2Psi + 2Psi + K Psi/Nd; 2Psi + (2+K)Psi/Nd; (2+2+K)Psi/Nd (ZeRO section 5)."""
    expected = [
        (2 + 2 + k) * psi,
        2 * psi + 2 * psi + k * psi / nd,
        2 * psi + (2 + k) * psi / nd,
        (2 + 2 + k) * psi / nd,
    ]
    for stage, want in enumerate(expected):
        assert total(model_state_bytes(psi, stage, nd, k)) == pytest.approx(want, rel=1e-12)


def test_zero_shards_each_category_from_its_own_stage():
    psi, nd = 1000.0, 10
    assert model_state_bytes(psi, 0, nd) == {"weights": 2000.0, "gradients": 2000.0, "optimizer": 12000.0}
    assert model_state_bytes(psi, 1, nd) == {"weights": 2000.0, "gradients": 2000.0, "optimizer": 1200.0}
    assert model_state_bytes(psi, 2, nd) == {"weights": 2000.0, "gradients": 200.0, "optimizer": 1200.0}
    assert model_state_bytes(psi, 3, nd) == {"weights": 200.0, "gradients": 200.0, "optimizer": 1200.0}


def test_rejects_unknown_zero_stage_and_bad_dp():
    with pytest.raises(ValueError, match="zero_stage must be 0, 1, 2 or 3, not 4"):
        model_state_bytes(1e9, 4, 8)
    with pytest.raises(ValueError, match="dp must be at least 1"):
        model_state_bytes(1e9, 1, 0)


# --- activations: Korthikanti et al. 2022 --------------------------------------------------------

GPT3 = {"s": 2048, "b": 1, "h": 12288, "a": 96}  # GPT-3 175B, the paper's example
MT_NLG = {"s": 2048, "b": 1, "h": 20480, "a": 128}


def test_activation_terms_add_up_as_in_section_4_1():
    """Section 4.1: attention 11sbh + 5as^2b, MLP 19sbh, two layernorms 4sbh."""
    s, b, h, a = 512, 4, 1024, 16
    sbh = s * b * h
    assert activation_bytes_per_layer(s, b, h, a) == pytest.approx(11 * sbh + 5 * a * s * s * b + 19 * sbh + 4 * sbh)


def test_selective_recompute_saves_what_section_5_says_for_gpt3_and_mt_nlg():
    """The paper's own numbers (section 5): 5as/h = 80 for GPT-3 and 64 for MT-NLG, so selective
    recomputation saves 70% and 65% of the activation memory."""
    for model, coefficient, saving in ((GPT3, 80, 0.70), (MT_NLG, 64, 0.65)):
        s, h, a = model["s"], model["h"], model["a"]
        assert 5 * a * s / h == coefficient
        for t, sp in ((1, False), (8, True)):
            full = activation_bytes_per_layer(**model, t=t, sp=sp)
            selective = activation_bytes_per_layer(**model, t=t, sp=sp, recompute="selective")
            assert 1 - selective / full == pytest.approx(saving, abs=0.005)


# The paper prints no per-layer byte figures for GPT-3, so these are Table 2's formulas evaluated
# for GPT-3 175B with t = 8 (s = 2048, b = 1, h = 12288, a = 96): sbh = 25,165,824.
@pytest.mark.parametrize(
    "t, sp, recompute, coefficient",
    [
        (1, False, "none", 34 + 80),  # no parallelism: sbh(34 + 5as/h)
        (8, False, "none", 10 + 24 / 8 + 80 / 8),  # tensor parallel: sbh(10 + 24/t + 5as/(ht))
        (8, True, "none", (34 + 80) / 8),  # tensor + sequence parallel: sbh/t (34 + 5as/h)
        (8, False, "selective", 10 + 24 / 8),  # tensor parallel + selective: sbh(10 + 24/t)
        (8, True, "selective", 34 / 8),  # tensor + sequence + selective: sbh(34/t)
        (1, False, "full", 2),  # full recomputation: sbh(2)
        (8, False, "full", 2),
    ],
)
def test_activation_bytes_per_layer_match_table_2(t, sp, recompute, coefficient):
    sbh = 2048 * 1 * 12288
    assert sbh == 25_165_824
    assert activation_bytes_per_layer(**GPT3, t=t, sp=sp, recompute=recompute) == pytest.approx(sbh * coefficient)


def test_gpt3_per_layer_values_in_bytes():
    """Formula values (not printed in the paper): 2.869 GB per layer unparallelised, 0.581 GB with
    t = 8, 0.359 GB with t = 8 and SP, 0.107 GB adding selective recompute."""
    values = [
        activation_bytes_per_layer(**GPT3, t=t, sp=sp, recompute=r) / GB
        for t, sp, r in ((1, False, "none"), (8, False, "none"), (8, True, "none"), (8, True, "selective"))
    ]
    assert values == pytest.approx([2.868904, 0.578814, 0.358613, 0.106955], abs=1e-6)


def test_parallelism_variants_reduce_to_each_other():
    s, b, h, a = 1024, 2, 2048, 16
    none = activation_bytes_per_layer(s, b, h, a)
    assert activation_bytes_per_layer(s, b, h, a, t=1) == none
    assert activation_bytes_per_layer(s, b, h, a, t=1, sp=True) == pytest.approx(none)
    for t in (2, 4, 8):
        assert activation_bytes_per_layer(s, b, h, a, t=t, sp=True) == pytest.approx(none / t)
        assert activation_bytes_per_layer(s, b, h, a, t=t) > none / t  # 10sbh stays replicated
    assert activation_bytes_per_layer(s, b, h, a, t=4, sp=True, recompute="full") == pytest.approx(2 * s * b * h / 4)


def test_rejects_unknown_recompute():
    with pytest.raises(ValueError, match="unknown recompute 'some' \\(valid: none, selective, full\\)"):
        activation_bytes_per_layer(8, 1, 16, 2, recompute="some")


# --- the timeline on hand-made logs --------------------------------------------------------------

F_S, B_S = 1.0, 2.0


def timed_log(order: dict[int, list[tuple[str, int]]], num_stages: int, extra: tuple[Span, ...] = ()) -> EventLog:
    """Time a one-stage-per-rank pipeline by hand: each op starts when its rank is free and its
    input is ready (F after the previous stage's F, B after the next stage's B and its own F)."""
    end: dict[tuple[str, int, int], float] = {}
    spans, free, pos = [], {r: 0.0 for r in order}, {r: 0 for r in order}
    while any(pos[r] < len(order[r]) for r in order):
        progressed = False
        for r in order:
            if pos[r] == len(order[r]):
                continue
            phase, mb = order[r][pos[r]]
            needs = [("F", mb, r - 1)] if phase == "F" and r > 0 else []
            if phase == "B":
                needs = [("F", mb, r)] + ([("B", mb, r + 1)] if r < num_stages - 1 else [])
            if all(n in end for n in needs):
                start = max([free[r]] + [end[n] for n in needs])
                stop = start + (F_S if phase == "F" else B_S)
                spans.append(Span(r, "compute", f"{phase}{mb}@{r}", phase, mb, r, start, stop))
                end[(phase, mb, r)] = free[r] = stop
                pos[r] += 1
                progressed = True
        assert progressed, "hand-made order deadlocks"
    return EventLog(tuple(spans) + extra, (), num_ranks=len(order), link_names=())


def gpipe(p: int, m: int) -> dict[int, list[tuple[str, int]]]:
    return {r: [("F", i) for i in range(m)] + [("B", i) for i in range(m)] for r in range(p)}


def one_f_one_b(p: int, m: int) -> dict[int, list[tuple[str, int]]]:
    order = {}
    for r in range(p):
        warmup = min(p - r - 1, m)
        ops = [("F", i) for i in range(warmup)]
        for i in range(m - warmup):
            ops += [("F", warmup + i), ("B", i)]
        order[r] = ops + [("B", i) for i in range(m - warmup, m)]
    return order


STATIC = {"weights": 2e9, "gradients": 2e9, "optimizer": 12e9}


def per_stage(p: int, nbytes=lambda r: 1e9 * (r + 1)) -> dict[int, dict[int, float]]:
    return {r: {r: nbytes(r)} for r in range(p)}


@pytest.mark.parametrize("p, m", [(2, 1), (4, 4), (4, 8), (3, 5)])
def test_gpipe_holds_every_microbatch(p, m):
    log = timed_log(gpipe(p, m), p)
    timeline = memory_timeline(log, {r: STATIC for r in range(p)}, per_stage(p))
    for r, rank in enumerate(timeline.ranks):
        assert rank.peaks["activations"] == m * 1e9 * (r + 1)
        assert rank.category("activations")[0] == (1e9 if r == 0 else 0.0)  # rank 0 starts F0 at t = 0
        assert rank.category("activations")[-1] == 0.0  # every backward has freed its forward's bytes
        for name, value in STATIC.items():  # static categories constant over the whole step
            assert set(rank.category(name).tolist()) == {value}
        assert rank.category("other").max() == 0.0
        assert rank.times_s[0] == 0.0 and rank.times_s[-1] == log.makespan_s


@pytest.mark.parametrize("p, m", [(2, 1), (4, 2), (4, 4), (4, 8), (3, 7)])
def test_one_f_one_b_holds_min_p_minus_r_m_microbatches(p, m):
    log = timed_log(one_f_one_b(p, m), p)
    timeline = memory_timeline(log, {r: STATIC for r in range(p)}, per_stage(p, lambda r: 3e8))
    for r, rank in enumerate(timeline.ranks):
        assert rank.peaks["activations"] == min(p - r, m) * 3e8
        assert rank.peaks["total"] == pytest.approx(16e9 + min(p - r, m) * 3e8)


def test_total_peak_is_the_peak_of_the_sum_not_the_sum_of_peaks():
    """Activations peak while the forward is held (0..3 s); a ZeRO-3 gather peaks later (4..6 s)."""
    spans = (
        Span(0, "compute", "F0@0", "F", 0, 0, 0.0, 1.0),
        Span(0, "compute", "B0@0", "B", 0, 0, 1.0, 3.0),
        Span(0, "dp", "ALL_GATHER params@1.t0.u0.F0@1", "ALL_GATHER", None, None, 4.0, 5.0, 5.0),
        Span(0, "compute", "F0@1", "F", 0, 1, 5.0, 6.0),
    )
    log = EventLog(spans, (), num_ranks=1, link_names=())
    rank = memory_timeline(log, {0: {"weights": 10.0}}, {0: {0: 7.0, 1: 0.0}}, zero3=True).ranks[0]
    peaks = rank.peaks
    assert peaks["activations"] == 7.0 and peaks["weights"] == 15.0
    assert peaks["total"] == 17.0 < peaks["activations"] + peaks["weights"]
    assert rank.peak_time_s == 0.0
    assert rank.times_s.tolist() == [0.0, 3.0, 4.0, 5.0, 6.0]
    assert rank.total.tolist() == [17.0, 10.0, 15.0, 15.0, 10.0]


def test_a_gathered_unit_is_held_from_its_gather_to_its_last_piece():
    """Unit 0 (8 B) starts in F0@0.0 and runs on in F0@0.1; unit 1 (6 B), gathered ahead while unit
    0 computes, starts in F0@0.2: unit 0 is freed when F0@0.1 ends (3 s), unit 1 when F0@0.2 does."""
    spans = (
        Span(0, "dp", "ALL_GATHER params@0.t0.u0.F0@0.0", "ALL_GATHER", None, None, 0.0, 1.0, 8.0),
        Span(0, "compute", "F0@0.0", "F", 0, 0, 1.0, 2.0),
        Span(0, "dp", "ALL_GATHER params@0.t0.u1.F0@0.2", "ALL_GATHER", None, None, 1.5, 2.5, 6.0),
        Span(0, "compute", "F0@0.1", "F", 0, 0, 2.0, 3.0),
        Span(0, "compute", "F0@0.2", "F", 0, 0, 3.0, 4.0),
    )
    log = EventLog(spans, (), num_ranks=1, link_names=())
    rank = memory_timeline(log, {}, {0: {0: 0.0}}, zero3=True).ranks[0]
    assert list(zip(rank.times_s.tolist(), rank.category("weights").tolist())) == [
        (0.0, 8.0),
        (1.0, 8.0),
        (1.5, 14.0),
        (3.0, 6.0),
        (4.0, 0.0),
    ]
    assert memory_timeline(log, {}, {0: {0: 0.0}}).ranks[0].peaks["weights"] == 0.0  # hook off


def test_a_backward_ending_as_a_forward_starts_frees_first():
    spans = (
        Span(0, "compute", "F0@0", "F", 0, 0, 0.0, 1.0),
        Span(0, "compute", "B0@0", "B", 0, 0, 1.0, 2.0),
        Span(0, "compute", "F1@0", "F", 1, 0, 2.0, 3.0),
        Span(0, "compute", "B1@0", "B", 1, 0, 3.0, 4.0),
    )
    log = EventLog(spans, (), num_ranks=1, link_names=())
    assert memory_timeline(log, {}, {0: {0: 5.0}}).ranks[0].peaks["activations"] == 5.0


def test_a_split_backward_frees_what_only_it_reads_and_the_rest_at_w():
    """Of a stage's 5 B, the 2 B `backward_frees` names (the loss's softmax) go when B ends, the
    other 3 B when its W does; without a W, all 5 B go at B."""
    spans = (
        Span(0, "compute", "F0@0", "F", 0, 0, 0.0, 1.0),
        Span(0, "compute", "B0@0", "B", 0, 0, 1.0, 2.0),
        Span(0, "compute", "W0@0", "W", 0, 0, 3.0, 4.0),
        Span(0, "compute", "F1@0", "F", 1, 0, 4.0, 5.0),
        Span(0, "compute", "B1@0", "B", 1, 0, 5.0, 6.0),
    )
    log = EventLog(spans, (), num_ranks=1, link_names=())
    rank = memory_timeline(log, {}, {0: {0: 5.0}}, backward_frees={0: {0: 2.0}}).ranks[0]
    assert list(zip(rank.times_s.tolist(), rank.category("activations").tolist())) == [
        (0.0, 5.0),
        (2.0, 3.0),
        (4.0, 5.0),
        (6.0, 0.0),
    ]


def test_rejects_backward_without_forward_and_missing_entries():
    b_only = EventLog((Span(1, "compute", "B0@1", "B", 0, 1, 0.0, 1.0),), (), num_ranks=2, link_names=())
    with pytest.raises(ValueError, match="rank 1: B0@1 ends but forward F0@1 never ran on this rank"):
        memory_timeline(b_only, {}, {1: {1: 1.0}})
    log = timed_log(gpipe(2, 1), 2)
    with pytest.raises(ValueError, match="no entry for rank 1, stage 1 \\(needed by F0@1\\)"):
        memory_timeline(log, {}, {0: {0: 1.0}})
    with pytest.raises(ValueError, match="unknown categories \\['activation'\\]"):
        memory_timeline(log, {0: {"activation": 1.0}}, per_stage(2))
    label = "ALL_GATHER params@0.t0.u0.F0@0"
    gather = EventLog((Span(0, "dp", label, "ALL_GATHER", None, None, 0.0, 1.0),), (), 1, ())
    with pytest.raises(ValueError, match=f"rank 0, {label}: not a ZeRO-3 gather of a piece that ran"):
        memory_timeline(gather, {}, {}, zero3=True)


def test_memory_peaks_is_summary_json_ready():
    p, m = 3, 4
    timeline = memory_timeline(timed_log(one_f_one_b(p, m), p), {r: STATIC for r in range(p)}, per_stage(p))
    peaks = memory_peaks(timeline)
    assert list(peaks) == ["0", "1", "2"]
    assert all(list(v) == [*CATEGORIES, "total"] for v in peaks.values())
    assert json.loads(json.dumps(peaks)) == peaks
    assert peaks["0"]["total"] == 16e9 + 3 * 1e9


def test_flags_ranks_over_capacity():
    peaks = {"0": {"total": 70e9}, "1": {"total": 90e9}, "2": {"total": 85e9}}
    assert ranks_over_capacity(peaks, 80e9) == [1, 2]
    assert capacity_message(peaks, 100e9) is None
    message = capacity_message(peaks, 80e9)
    assert "2 rank(s) exceed the GPU's 74.5 GiB" in message and "worst rank 1 peaks at 83.8 GiB" in message


# --- the timeline on logs the engine produced ----------------------------------------------------


@pytest.mark.parametrize("kind, p, m, v", [("gpipe", 4, 6, 1), ("1f1b", 4, 6, 1), ("interleaved", 2, 4, 2)])
def test_activation_peak_is_inflight_microbatches_times_bytes_on_engine_logs(kind, p, m, v):
    """Cross-check against metrics.peak_inflight_microbatches_per_rank, with equal bytes per stage."""
    where = stage_ranks(p, v)
    program = build_program(
        rank_order(kind, p, m, v), m, where, 0.0, forward_flops=lambda s: F_S, backward_flops=lambda s: B_S
    )
    log = run_program(program, Network(simpy.Environment(), switch(p, 1e9, 0.0)), compute_time_s=lambda op: op.flops)
    activation = {r: {s: 4e8 for s, rank in where.items() if rank == r} for r in range(p)}
    peaks = memory_peaks(memory_timeline(log, {}, activation))
    inflight = peak_inflight_microbatches_per_rank(log)
    assert [peaks[str(r)]["activations"] for r in range(p)] == [n * 4e8 for n in inflight]


# --- memory.png ----------------------------------------------------------------------------------


def test_plot_writes_the_same_png_twice(tmp_path):
    p, m = 6, 8
    log = timed_log(one_f_one_b(p, m), p)
    timeline = memory_timeline(log, {r: STATIC for r in range(p)}, per_stage(p, lambda r: 8e9))
    assert [r.rank for r in worst_ranks(timeline)] == [0, 1, 2, 3]
    first, second, bare = tmp_path / "a.png", tmp_path / "b.png", tmp_path / "c.png"
    plot_memory(timeline, 80e9, first, "1f1b, pp=6")
    plot_memory(timeline, 80e9, second, "1f1b, pp=6")
    plot_memory(timeline, None, bare, "no capacity")
    assert first.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert first.read_bytes() == second.read_bytes()
    assert bare.stat().st_size > 0
