"""`clustersim compare`: the step-time breakdown on hand-made logs with known answers, its sum
identity on real runs, the outputs (written, byte-identical on a second run), and bad input."""

import json

import numpy as np
import pytest

from clustersim.sim.cli import main
from clustersim.sim.engine.records import EventLog, Span
from clustersim.sim.folder import MARKER
from clustersim.sim.results.breakdown import EXPOSED_KINDS, alltoall_busbw_GBps, message_departures, step_breakdown
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario_text

# 8 GPUs: pp 2 x dp 2 x tp 2 with sequence parallelism and ZeRO-1, so p2p, all-reduce,
# reduce-scatter and all-gather all happen; the same job on a switch and on a slower ring.
SWITCH = """\
name: small-switch
cluster:
  gpu: A100-SXM-80GB
  nodes: 1
  gpus_per_node: 8
  topology: {kind: switch, link_bandwidth: 300GB/s, link_latency: 1us}
model: {preset: tiny-8l}
training: {global_batch: 16, micro_batch: 2, dtype: bf16}
parallel: {pp: 2, dp: 2, tp: 2, zero: 1, sequence_parallel: true}
schedule: 1f1b
numerics: {enabled: false}
"""
RING = SWITCH.replace("small-switch", "small-ring").replace(
    "kind: switch, link_bandwidth: 300GB/s", "kind: ring, link_bandwidth: 100GB/s"
)


def span(rank, stream, label, phase, start, end, nbytes=0.0):
    return Span(rank, stream, label, phase, None, None, start, end, nbytes)


def hand_log(spans, num_ranks=2):
    return EventLog(tuple(spans), (), num_ranks, ())


# Step 0..8 s. Rank 0: compute [0,2] [6,7]; all-reduce [1,4] (and an overlapping one on another
# stream, [1.5,3.5]); a send [3,5]; a zero-length all-gather at 5.5. Rank 1: all-to-all [0,3],
# all-reduce [2,5], recv [4,6], optimizer [7,8].
#   rank 0: compute 3; all_reduce [2,4] = 2; p2p [4,5] = 1 ([3,4] is all_reduce's); bubble [5,6] [7,8] = 2
#   rank 1: compute 1; all_to_all [0,3] = 3; all_reduce [3,5] = 2; p2p [5,6] = 1; bubble [6,7] = 1
HAND = [
    span(0, "compute", "F0@0", "F", 0.0, 2.0),
    span(0, "dp", "ALL_REDUCE g0", "ALL_REDUCE", 1.0, 4.0),
    span(0, "tp", "ALL_REDUCE t0", "ALL_REDUCE", 1.5, 3.5),
    span(0, "send", "SEND F0@0", "SEND", 3.0, 5.0),
    span(0, "dp", "ALL_GATHER g1", "ALL_GATHER", 5.5, 5.5),
    span(0, "compute", "B0@0", "B", 6.0, 7.0),
    span(1, "ep", "ALL_TO_ALL a0", "ALL_TO_ALL", 0.0, 3.0),
    span(1, "dp", "ALL_REDUCE g0", "ALL_REDUCE", 2.0, 5.0),
    span(1, "recv", "RECV F0@0", "RECV", 4.0, 6.0),
    span(1, "compute", "OPT@1", "OPT", 7.0, 8.0),
]


def test_breakdown_of_a_hand_made_log_has_the_known_answers():
    b = step_breakdown(hand_log(HAND))
    assert b.step_time_s == 8.0
    assert b.compute_s.tolist() == [3.0, 1.0]
    assert b.bubble_s.tolist() == [2.0, 1.0]
    expected = {"all_to_all": [0.0, 3.0], "all_reduce": [2.0, 2.0], "p2p": [1.0, 1.0]}
    exposed = {k: v.tolist() for k, v in b.exposed_s.items()}
    assert exposed == {k: expected.get(k, [0.0, 0.0]) for k in EXPOSED_KINDS}
    # in_kind_s: the union of a kind's spans, hidden under compute or not
    assert b.in_kind_s["all_reduce"].tolist() == [3.0, 3.0]
    assert b.in_kind_s["all_to_all"].tolist() == [0.0, 3.0]
    assert b.in_kind_s["p2p"].tolist() == [2.0, 2.0]
    means = b.means()
    assert means["compute_s"] == 2.0 and means["bubble_s"] == 1.5
    assert means["exposed_comm_s"]["all_to_all"] == 1.5 and means["exposed_comm_s"]["p2p"] == 1.0


def test_priority_order_decides_between_kinds_active_at_once():
    both = [
        span(0, "dp", "ALL_GATHER x", "ALL_GATHER", 0.0, 2.0),
        span(0, "tp", "REDUCE_SCATTER y", "REDUCE_SCATTER", 1.0, 3.0),
        span(0, "send", "SEND F0@0", "SEND", 0.0, 4.0),
    ]
    exposed = step_breakdown(hand_log(both, 1)).exposed_s
    # reduce_scatter outranks all_gather on [1, 2]; p2p only owns what no collective covers
    assert (exposed["reduce_scatter"][0], exposed["all_gather"][0], exposed["p2p"][0]) == (2.0, 1.0, 1.0)


def test_a_recv_counts_only_from_when_its_message_left_the_sender():
    spans = [
        span(0, "compute", "F0@0", "F", 0.0, 2.0),
        span(0, "send", "SEND F0@0", "SEND", 2.0, 3.0),
        span(1, "recv", "RECV F0@0", "RECV", 0.0, 3.0),
        span(1, "compute", "F0@1", "F", 3.0, 5.0),
    ]
    whole = step_breakdown(hand_log(spans))
    assert whole.exposed_s["p2p"][1] == 3.0 and whole.bubble_s[1] == 0.0  # the wait for stage 0 looks like p2p
    sent = step_breakdown(hand_log(spans), sent_s={(1, "recv", "RECV F0@0"): 2.0})
    assert sent.exposed_s["p2p"][1] == 1.0 and sent.bubble_s[1] == 2.0  # waiting for the producer is bubble


def test_an_unknown_phase_is_an_error_naming_it():
    with pytest.raises(ValueError, match="span phase 'WARP'"):
        step_breakdown(hand_log([span(0, "compute", "x", "WARP", 0.0, 1.0)], 1))


def test_an_empty_log_is_all_zeros():
    b = step_breakdown(hand_log([], 2))
    assert b.compute_s.tolist() == b.bubble_s.tolist() == [0.0, 0.0]


def test_alltoall_busbw_is_nccl_tests_bus_bandwidth():
    # groups of 4; rank 0 sends 3 GB in 3 s, rank 1 1 GB in 1 s: algbw 1 GB/s each, busbw x 3/4
    a2a = "ALL_TO_ALL"
    spans = [
        span(0, "ep", f"{a2a} a", a2a, 0.0, 3.0),
        span(1, "ep", f"{a2a} a", a2a, 2.0, 3.0),
        span(2, "ep", f"{a2a} b", a2a, 1.0, 1.0),
    ]  # zero length: left out
    sizes = {
        (0, "ep", "ALL_TO_ALL a"): (4, 3e9),
        (1, "ep", "ALL_TO_ALL a"): (4, 1e9),
        (2, "ep", "ALL_TO_ALL b"): (4, 1e9),
    }
    assert alltoall_busbw_GBps(hand_log(spans, 3), sizes) == pytest.approx(0.75)
    assert alltoall_busbw_GBps(hand_log([], 1), {}) is None
    # a tiny exchange (8 bytes in 1 ms) adds its bytes and its time, it does not halve the figure
    spans.append(span(0, "ep", f"{a2a} c", a2a, 5.0, 5.001))
    sizes[(0, "ep", "ALL_TO_ALL c")] = (4, 8.0)
    assert alltoall_busbw_GBps(hand_log(spans, 3), sizes) == pytest.approx((3e9 + 1e9 + 8) * 0.75 / 4.001 / 1e9)


@pytest.fixture(scope="module")
def runs():
    return [simulate(load_scenario_text(text, f"{name}.yaml")) for name, text in (("switch", SWITCH), ("ring", RING))]


def test_breakdown_of_real_runs_sums_to_the_step_time(runs):
    for result in runs:
        sent = message_departures(result.program, result.log)
        assert {(s.rank, s.stream, s.label) for s in result.log.spans if s.phase == "RECV"} == set(sent)
        b = step_breakdown(result.log, result.summary["step_time_s"], sent)
        per_rank = b.compute_s + b.bubble_s + sum(b.exposed_s.values())
        np.testing.assert_allclose(per_rank, b.step_time_s, rtol=0, atol=1e-9)
        assert min(b.bubble_s.min(), *(v.min() for v in b.exposed_s.values())) >= -1e-12
        m = b.means()
        assert abs(m["compute_s"] + m["bubble_s"] + sum(m["exposed_comm_s"].values()) - b.step_time_s) <= 1e-9
        for kind in ("all_reduce", "reduce_scatter", "all_gather", "p2p"):  # this job has all four
            assert b.in_kind_s[kind].mean() > 0, kind
    switch, ring = (step_breakdown(r.log).means()["exposed_comm_s"] for r in runs)
    assert ring["reduce_scatter"] > switch["reduce_scatter"]  # a third of the bandwidth, on a ring


def test_compare_writes_its_outputs_byte_identical_on_a_second_run(tmp_path, monkeypatch, capsys):
    (tmp_path / "a.yaml").write_text(SWITCH)
    (tmp_path / "b.yaml").write_text(RING)
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "a.yaml", "b.yaml", "-o", "first"]) == 0
    out = capsys.readouterr().out
    assert main(["compare", "a.yaml", "b.yaml"]) == 0  # the default folder
    second = tmp_path / "runs" / "compare-small-switch-vs-small-ring"
    names = sorted([MARKER, "compare.json", "compare.md", "compare.png"])
    assert sorted(p.name for p in (tmp_path / "first").iterdir()) == sorted(p.name for p in second.iterdir()) == names
    for name in names:
        assert (tmp_path / "first" / name).read_bytes() == (second / name).read_bytes(), name
    rows = json.loads((second / "compare.json").read_text())
    assert [r["name"] for r in rows] == ["small-switch", "small-ring"]
    assert list(rows[0]) == [
        "name",
        "step_time_s",
        "compute_s",
        "bubble_s",
        "exposed_comm_s",
        "exposed_by_group_s",
        "alltoall_time_s",
        "allreduce_time_s",
        "megatron_bubble_over_ideal_mean",
        "mfu",
        "hottest_links",
        "alltoall_busbw_GBps",
        "memory_peak_bytes",
        "memory_capacity_bytes",
        "fits",
    ]
    for r in rows:
        assert abs(r["compute_s"] + r["bubble_s"] + sum(r["exposed_comm_s"].values()) - r["step_time_s"]) <= 1e-9
        assert list(r["exposed_comm_s"]) == list(EXPOSED_KINDS) and len(r["hottest_links"]) == 3
        assert r["alltoall_time_s"] == 0.0 and r["alltoall_busbw_GBps"] is None  # no MoE here
    table = (second / "compare.md").read_text()
    assert table in out  # the terminal prints the markdown table
    for r in rows:  # the same exposed time by group: pipeline sends, TP and ZeRO-1's DP collectives
        assert sum(r["exposed_by_group_s"].values()) == pytest.approx(sum(r["exposed_comm_s"].values()), rel=1e-12)
        assert r["exposed_by_group_s"]["PP"] == pytest.approx(r["exposed_comm_s"]["p2p"], rel=1e-12)
        by_group = [f"{1e3 * r['exposed_by_group_s'][g]:.3f}" for g in ("TP", "PP", "DP")]
        assert f"| {r['name']} | " + " | ".join(by_group) + " |" in table
    ratio = rows[1]["step_time_s"] / rows[0]["step_time_s"]
    assert f"**small-switch** is the fastest: {ratio:.2f}x faster than small-ring" in table
    assert (second / "compare.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    "argv,field",
    [
        (["good.yaml", "bad.yaml"], "bad.yaml: parallel.pp: "),
        (["good.yaml", "missing.yaml"], "missing.yaml: -: no such file"),
        (
            ["good.yaml"],
            "(command line): SCENARIO: compare needs at least two scenarios (files, or a file's variants), got 1",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, capsys, argv, field):
    (tmp_path / "good.yaml").write_text(SWITCH)
    (tmp_path / "bad.yaml").write_text(RING.replace("pp: 2,", "pp: 0,"))
    monkeypatch.chdir(tmp_path)
    assert main(["compare", *argv, "-o", "out"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"clustersim: error: {field}"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "good.yaml"]


def test_a_strategy_that_does_not_fit_is_marked_and_not_ranked():
    """The faster scenario on GPUs of 1 GiB runs out of memory: the table says so beside its peak,
    and the slower one that fits is named the fastest of those that fit."""
    from clustersim.sim.compare import compare_row, markdown

    tight = SWITCH.replace("  gpu: A100-SXM-80GB\n", "  gpu: A100-SXM-80GB\n  gpu_overrides: {memory: 1GiB}\n")
    results = [simulate(load_scenario_text(text, "c.yaml")) for text in (tight, RING)]
    rows = [compare_row(r) for r in results]
    assert rows[0]["step_time_s"] < rows[1]["step_time_s"]  # it would win on time alone
    assert [r["fits"] for r in rows] == [False, True]
    assert rows[0]["memory_peak_bytes"] > rows[0]["memory_capacity_bytes"] == 2**30
    assert rows[0]["memory_peak_bytes"] == max(
        peak["total"] for peak in results[0].summary["memory_peak_bytes_per_rank"].values()
    )
    table = markdown(rows)
    assert f"| {rows[0]['memory_peak_bytes'] / 2**30:.1f} (does not fit) |" in table
    assert "**small-ring** is the fastest of those that fit." in table
    assert "small-switch does not fit" in table and "and is not ranked" in table
