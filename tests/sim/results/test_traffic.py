"""The all-to-alls' share of the step and the GPU x GPU traffic matrix (summary.json, traffic.png):
closed forms on an evenly routed MoE run, a hand-made log, the step breakdown of `compare` as a
second opinion, and a dense run that has no all-to-all but still gets its traffic.png."""

import json

import numpy as np
import pytest

from clustersim.sim.cli import main
from clustersim.sim.engine.records import EventLog, Span
from clustersim.sim.folder import MARKER
from clustersim.sim.network.records import FlowSpan
from clustersim.sim.report import OUTPUT_FILES, terminal_summary
from clustersim.sim.results.breakdown import step_breakdown
from clustersim.sim.results.metrics import alltoall_time_share, traffic_matrix_bytes
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario_text
from clustersim.sim.views.traffic import traffic_panels

# 8 GPUs, dp 8 split into expert-parallel groups of `ep` consecutive ranks; tokens routed evenly.
MOE = """\
name: traffic-moe
cluster: {{gpu: H100-SXM, nodes: 1, gpus_per_node: 8, topology: {{kind: switch, link_bandwidth: 450GB/s,
          link_latency: 1us}}}}
model: {{layers: {layers}, hidden: 512, heads: 8, ffn: 2048, seq_len: 512, vocab: 1000,
        moe: {{experts: 8, top_k: 2, every: {every}, expert_ffn: 1024}}}}
training: {{global_batch: {global_batch}, micro_batch: 1, dtype: bf16}}
parallel: {{pp: 1, dp: 8, ep: {ep}, zero: 0, bucket: 1GB}}
numerics: {{enabled: false}}
"""
DENSE = """\
name: traffic-dense
cluster: {gpu: A100-SXM-80GB, nodes: 1, gpus_per_node: 4, topology: {kind: switch, link_bandwidth: 300GB/s,
          link_latency: 1us}}
model: {preset: tiny-8l}
training: {global_batch: 8, micro_batch: 2, dtype: bf16}
parallel: {pp: 2, dp: 2}
schedule: 1f1b
numerics: {enabled: false}
"""
GPUS, H, S, K, E, BF16 = 8, 512, 512, 2, 8, 2
TOKENS = S * K * H * BF16  # one rank's dispatch (or combine) buffer: its s tokens, k rows each, h wide
COUNTS = E * 8  # the counts exchanged before each dispatch: one int64 per expert


def moe_text(ep: int, layers: int = 2, every: int = 1, m: int = 2) -> str:
    return MOE.format(layers=layers, every=every, global_batch=m * GPUS, ep=ep)


def moe_run(ep: int, layers: int = 2, every: int = 1, m: int = 2):
    return simulate(load_scenario_text(moe_text(ep, layers, every, m), "moe.yaml"))


@pytest.mark.parametrize("ep,layers,every", [(2, 2, 1), (4, 2, 1), (4, 4, 2), (8, 2, 1)])
def test_even_alltoall_traffic_is_uniform_within_each_ep_group_and_zero_across(ep, layers, every):
    """Every MoE layer of every microbatch: dispatch and combine each way (4 token all-to-alls) and
    one counts exchange before the forward's dispatch; an even all-to-all sends S/ep to each peer."""
    m, moe_layers = 2, layers // every
    summary = moe_run(ep, layers, every, m).summary
    matrix = np.array(summary["alltoall_traffic_matrix_bytes"])
    pair = m * moe_layers * (4 * TOKENS + COUNTS) / ep
    group = np.arange(GPUS) // ep  # groups of ep consecutive data-parallel ranks, rank r on GPU r
    expected = np.where((group[:, None] == group[None, :]) & ~np.eye(GPUS, dtype=bool), pair, 0.0)
    np.testing.assert_allclose(matrix, expected, rtol=1e-12, atol=0)
    total = m * moe_layers * (4 * TOKENS + COUNTS) * (ep - 1) / ep * GPUS
    assert summary["alltoall_bytes_total"] == pytest.approx(total, rel=1e-12)


def test_counts_exchanges_are_the_small_messages_one_per_layer_microbatch_and_peer():
    ep, m, layers = 4, 2, 2
    log = moe_run(ep, layers, m=m).log
    flows = log.flows
    on_ep = np.array([flows.labels[i].startswith("ep:") for i in flows.label], dtype=bool)
    counts = on_ep & (flows.nbytes == COUNTS / ep)
    assert counts.sum() == m * layers * GPUS * (ep - 1)
    assert (on_ep & ~counts).sum() == 4 * m * layers * GPUS * (ep - 1)
    assert (flows.nbytes[on_ep & ~counts] == TOKENS / ep).all()


def test_all_messages_matrix_adds_up_to_the_bytes_each_rank_sent():
    result = moe_run(ep=4)
    everything = traffic_matrix_bytes(result.log, GPUS)
    sent = result.summary["comm_bytes_sent_per_rank"]
    np.testing.assert_allclose(everything.sum(axis=1), [sum(sent[str(g)].values()) for g in range(GPUS)], rtol=1e-12)
    ep_only = traffic_matrix_bytes(result.log, GPUS, ["ep"])
    np.testing.assert_allclose(ep_only.sum(axis=1), [sent[str(g)]["ep"] for g in range(GPUS)], rtol=1e-12)
    assert (everything >= ep_only).all() and everything.sum() > ep_only.sum()


def hand_log(spans, num_ranks):
    return EventLog(tuple(spans), (), num_ranks, ())


def test_alltoall_share_of_a_hand_made_log():
    """Step 0..10 s on 2 ranks. Rank 0: all-to-alls [1, 3] and [2, 4] (overlapping: 3 s inside);
    rank 1: [5, 6] (1 s). Share = (3 + 1) / (10 x 2) = 0.2."""
    spans = [
        Span(0, "ep", "a", "ALL_TO_ALL", None, None, 1.0, 3.0),
        Span(0, "ep2", "b", "ALL_TO_ALL", None, None, 2.0, 4.0),
        Span(1, "ep", "c", "ALL_TO_ALL", None, None, 5.0, 6.0),
        Span(1, "dp", "d", "ALL_REDUCE", None, None, 0.0, 9.0),
        Span(0, "compute", "F0@0", "F", 0, 0, 0.0, 10.0),
    ]
    assert alltoall_time_share(hand_log(spans, 2)) == pytest.approx(0.2, rel=1e-12)
    assert alltoall_time_share(hand_log(spans[3:], 2)) == 0.0
    assert alltoall_time_share(hand_log((), 2)) == 0.0


def test_traffic_matrix_of_a_hand_made_log_by_stream():
    flows = [
        FlowSpan(0, 1, (0,), 0.0, 1.0, 100.0, "ep:x"),
        FlowSpan(0, 1, (0,), 0.0, 1.0, 20.0, "ep:y"),
        FlowSpan(2, 0, (1,), 0.0, 1.0, 5.0, "send:z"),
        FlowSpan(1, 2, (2,), 0.0, 1.0, 7.0, "dp:w"),
    ]
    log = EventLog((), tuple(flows), 3, ())
    assert traffic_matrix_bytes(log, 3, ["ep"]).tolist() == [[0, 120, 0], [0, 0, 0], [0, 0, 0]]
    assert traffic_matrix_bytes(log, 3).tolist() == [[0, 120, 0], [0, 0, 7], [5, 0, 0]]
    assert traffic_matrix_bytes(log, 3, ["tp"]).sum() == 0
    # GPUs in blocks of two, {0, 1} and {2}: a huge run's matrix
    assert traffic_matrix_bytes(log, 3, block=2).tolist() == [[120, 7], [5, 0]]


def test_alltoall_share_is_the_step_breakdowns_time_in_all_to_all_over_the_step():
    """compare's breakdown sweeps the same spans another way: mean over ranks of the union of
    all-to-all spans / step time."""
    result = moe_run(ep=4)
    breakdown = step_breakdown(result.log)
    share = result.summary["alltoall_time_share"]
    assert share == pytest.approx(breakdown.in_kind_s["all_to_all"].mean() / breakdown.step_time_s, rel=1e-9)
    assert 0 < share < 1
    assert f"all-to-all       {100 * share:.2f} % of rank time" in terminal_summary(result)
    assert [title for title, _ in traffic_panels(result.log, GPUS)] == ["all messages", "expert-parallel all-to-all"]


def test_moe_run_writes_traffic_png_and_an_identical_summary_twice(tmp_path):
    path = tmp_path / "moe.yaml"
    path.write_text(moe_text(ep=4))
    assert main(["run", str(path), "-o", str(tmp_path / "a")]) == 0
    assert main(["run", str(path), "-o", str(tmp_path / "b")]) == 0
    for name in ("summary.json", "traffic.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert (tmp_path / "a" / "traffic.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dense_run_has_no_alltoall_share_and_still_writes_traffic_png(tmp_path, capsys):
    path = tmp_path / "dense.yaml"
    path.write_text(DENSE)
    assert main(["run", str(path), "-o", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([MARKER, *OUTPUT_FILES])
    assert "traffic.png" in OUTPUT_FILES
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["alltoall_time_share"] == 0.0
    assert summary["alltoall_bytes_total"] == 0.0
    assert summary["alltoall_traffic_matrix_bytes"] is None
    assert "all-to-all" not in capsys.readouterr().out
    assert (tmp_path / "out" / "traffic.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_traffic_matrix_is_left_out_of_the_summary_above_64_gpus(monkeypatch):
    import clustersim.sim.results.summary as summary_module

    monkeypatch.setattr(summary_module, "TRAFFIC_MATRIX_MAX_GPUS", 4)
    summary = moe_run(ep=2).summary
    assert summary["alltoall_traffic_matrix_bytes"] is None and summary["alltoall_bytes_total"] > 0
