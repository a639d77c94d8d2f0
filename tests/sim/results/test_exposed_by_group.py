"""Exposed communication by parallelism (issue 14's "exposed communication by kind (TP, PP, DP,
EP)"): the exposed time of the step breakdown split by the group each span serves, its op's stream
(sim.results.breakdown.GROUP_OF_STREAM), summing to the split by collective kind."""

import pytest

from clustersim.schedules.ir import Comm, Phase
from clustersim.sim.engine.records import EventLog, Span
from clustersim.sim.report import breakdown_line
from clustersim.sim.results.breakdown import GROUPS, step_breakdown
from clustersim.sim.results.csv_tables import rank_rows
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario_text


def span(stream, phase, start_s, end_s, rank=0):
    return Span(rank, stream, f"{stream} {start_s}", phase, None, None, start_s, end_s)


def test_a_hand_made_timeline_splits_as_its_spans_say():
    """Rank 0: compute [0, 1]; a TP all-reduce [1, 2] and a DP all-reduce [1.5, 3] (both exposed,
    TP first in GROUPS where both run); a pipeline send [3, 4]; a DP all-gather under compute
    [4, 5] (hidden); an EP all-to-all [5, 5.5]; idle to 6."""
    spans = (
        span("compute", Phase.F, 0.0, 1.0),
        span("tp", Comm.ALL_REDUCE, 1.0, 2.0),
        span("dp", Comm.ALL_REDUCE, 1.5, 3.0),
        span("send", Comm.SEND, 3.0, 4.0),
        span("compute", Phase.B, 4.0, 5.0),
        span("dp", Comm.ALL_GATHER, 4.0, 5.0),
        span("ep", Comm.ALL_TO_ALL, 5.0, 5.5),
    )
    b = step_breakdown(EventLog(spans, (), 1, ()), step_time_s=6.0)
    assert {g: float(v[0]) for g, v in b.exposed_by_group_s.items()} == {"TP": 1.0, "PP": 1.0, "DP": 1.0, "EP": 0.5}
    assert float(b.exposed_s["all_reduce"][0]) == 2.0 and float(b.exposed_s["p2p"][0]) == 1.0
    assert float(b.bubble_s[0]) == 0.5


def test_a_stream_of_no_group_keeps_its_name():
    spans = (span("compute", Phase.F, 0.0, 1.0), span("side", Comm.BROADCAST, 1.0, 1.25))
    b = step_breakdown(EventLog(spans, (), 1, ()), step_time_s=1.25)
    assert float(b.exposed_by_group_s["side"][0]) == 0.25
    assert tuple(b.exposed_by_group_s)[: len(GROUPS)] == GROUPS


SCENARIO = """
name: groups
cluster: {gpu: A100-SXM-80GB, nodes: 2, gpus_per_node: 4,
          topology: {kind: fattree, nvlink_bandwidth: 300GB/s, nic_bandwidth: 25GB/s, leaf_radix: 4,
                    link_latency: 1us}}
model: {layers: 4, hidden: 1024, heads: 16, ffn: 4096, seq_len: 512, vocab: 8000}
training: {global_batch: 16, micro_batch: 2, dtype: bf16}
parallel: {tp: 2, pp: 2, dp: 2}
schedule: 1f1b
numerics: {enabled: false}
"""


def test_a_run_reports_each_groups_exposed_time_and_they_sum_to_the_kinds():
    result = simulate(load_scenario_text(SCENARIO))
    b = result.summary["time_breakdown_s"]
    by_group, by_kind = b["exposed_comm_by_group"], b["exposed_comm"]
    assert set(by_group) == set(GROUPS)
    assert sum(by_group.values()) == pytest.approx(sum(by_kind.values()), rel=1e-12)
    assert by_group["PP"] == pytest.approx(by_kind["p2p"], rel=1e-12)  # only the pipeline sends point to point
    assert by_group["TP"] > 0 and by_group["DP"] > 0 and by_group["EP"] == 0.0
    per_rank = result.summary["exposed_comm_by_group_s_per_rank"]
    assert len(per_rank) == 8 and per_rank[0]["TP"] > 0
    rows = rank_rows(result.summary)
    assert rows[0]["exposed_TP_s"] == per_rank[0]["TP"] and rows[0]["exposed_DP_s"] == per_rank[0]["DP"]
    line = breakdown_line(result.summary)
    assert f"TP {by_group['TP'] * 1e3:.3f} ms" in line and "EP" not in line.splitlines()[-1]
