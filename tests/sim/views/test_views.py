"""Views of the event log: Chrome trace, Gantt PNG, text table. Each is a pure function of the log."""

from __future__ import annotations

import json

import pytest

from clustersim.sim.engine.records import EventLog, Span
from clustersim.sim.network.records import FlowSpan
from clustersim.sim.results.table import format_table, time_unit
from clustersim.sim.results.trace import chrome_trace, rank_pid, write_trace
from clustersim.sim.views.gantt import lane_layout, plot_gantt

MS = 1e-3


def small_log() -> EventLog:
    """Two pipeline stages, two microbatches, one extra idle rank; times in ms, chosen by hand."""
    spans = (
        Span(0, "compute", "F0@0", "F", 0, 0, 0.0, 1.0 * MS, flops=1e9),
        Span(0, "send", "SEND F0@0", "SEND", 0, 0, 1.0 * MS, 1.5 * MS, nbytes=4096),
        Span(1, "recv", "RECV F0@0", "RECV", 0, 0, 0.0, 1.5 * MS, nbytes=4096),
        Span(0, "compute", "F1@0", "F", 1, 0, 1.0 * MS, 2.0 * MS, flops=1e9),
        Span(1, "compute", "F0@1", "F", 0, 1, 1.5 * MS, 2.5 * MS, flops=1e9),
        Span(1, "compute", "B0@1", "B", 0, 1, 2.5 * MS, 4.5 * MS, flops=2e9),
        Span(1, "send", "SEND B0@1", "SEND", 0, 1, 4.5 * MS, 5.0 * MS, nbytes=4096),
        Span(0, "recv", "RECV B0@1", "RECV", 0, 1, 2.0 * MS, 5.0 * MS, nbytes=4096),
        Span(0, "compute", "B0@0", "B", 0, 0, 5.0 * MS, 7.0 * MS, flops=2e9),
        Span(0, "compute", "OPT@0", "OPT", None, 0, 7.0 * MS, 7.25 * MS),
    )
    flows = (
        FlowSpan(0, 1, (0, 1), 1.0 * MS, 1.5 * MS, 4096, "F0@0 0->1"),
        FlowSpan(1, 0, (2,), 4.5 * MS, 5.0 * MS, 4096, "B0@1 1->0"),
        FlowSpan(0, 1, (0,), 1.2 * MS, 1.4 * MS, 1024, "extra 0->1"),  # overlaps the first on link 0
    )
    return EventLog(spans, flows, num_ranks=3, link_names=("gpu0->sw", "sw->gpu1", "gpu1->gpu0"))


def x_events(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def meta(trace: dict, name: str) -> dict[tuple[int, int], object]:
    return {
        (e["pid"], e["tid"]): next(iter(e["args"].values()))
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == name
    }


def test_trace_has_one_event_per_span_and_per_flow_link():
    log = small_log()
    events = x_events(chrome_trace(log))
    assert len(events) == len(log.spans) + sum(len(f.links) for f in log.flows)
    on_ranks = [e["name"] for e in events if e["pid"] != rank_pid(log.num_ranks)]
    assert sorted(on_ranks) == sorted(s.label for s in log.spans)


def test_trace_of_chosen_ranks_keeps_only_their_spans_and_says_so():
    log = small_log()
    trace = chrome_trace(log, ranks=[1])
    on_ranks = [e for e in x_events(trace) if e["pid"] != rank_pid(log.num_ranks)]
    assert sorted(e["name"] for e in on_ranks) == sorted(s.label for s in log.spans if s.rank == 1)
    names = meta(trace, "process_name").values()
    assert "rank 1" in names and "rank 0" not in names
    assert any(str(name).startswith("2 other ranks left out") for name in names)


def test_trace_maps_rank_to_pid_and_stream_to_tid():
    log = small_log()
    trace = chrome_trace(log)
    threads = meta(trace, "thread_name")
    by_label = {(e["pid"], e["name"]): e for e in x_events(trace)}
    for span in log.spans:
        event = by_label[(rank_pid(span.rank), span.label)]
        assert threads[(rank_pid(span.rank), event["tid"])] == span.stream
        assert event["cat"] == span.phase
    assert [threads[(rank_pid(0), t)] for t in (1, 2, 3)] == ["compute", "send", "recv"]


def test_trace_ids_start_at_one_because_perfetto_treats_zero_specially():
    trace = chrome_trace(small_log())
    assert rank_pid(0) == 1
    assert min(e["pid"] for e in trace["traceEvents"]) == 1
    assert min(e["tid"] for e in x_events(trace)) == 1


def test_trace_times_are_microseconds_of_the_input():
    trace = chrome_trace(small_log())
    b0 = next(e for e in x_events(trace) if e["name"] == "B0@1")
    assert b0["ts"] == pytest.approx(2500.0) and b0["dur"] == pytest.approx(2000.0)
    assert b0["args"] == {"microbatch": 0, "stage": 1, "bytes": 0.0, "flops": 2e9}
    send = next(e for e in x_events(trace) if e["name"] == "SEND F0@0")
    assert send["ts"] == pytest.approx(1000.0) and send["dur"] == pytest.approx(500.0)
    assert send["args"]["bytes"] == 4096


def test_trace_names_processes_and_link_threads():
    log = small_log()
    trace = chrome_trace(log)
    procs = meta(trace, "process_name")
    assert [procs[(rank_pid(r), 0)] for r in range(3)] == ["rank 0", "rank 1", "rank 2"]
    net = rank_pid(log.num_ranks)
    assert procs[(net, 0)] == "network"
    assert meta(trace, "process_sort_index")[(rank_pid(2), 0)] == 2
    links = meta(trace, "thread_name")
    net_threads = sorted(name for (pid, _), name in links.items() if pid == net)
    assert net_threads == ["gpu0->sw", "gpu0->sw #2", "gpu1->gpu0", "sw->gpu1"]
    flow_events = [e for e in x_events(trace) if e["pid"] == net]
    on_link0 = sorted((e["name"], links[(net, e["tid"])]) for e in flow_events if e["ts"] < 1500)
    assert on_link0 == [("F0@0 0->1", "gpu0->sw"), ("F0@0 0->1", "sw->gpu1"), ("extra 0->1", "gpu0->sw #2")]


def test_trace_round_trips_through_json_and_is_deterministic(tmp_path):
    log = small_log()
    write_trace(log, tmp_path / "a.json")
    write_trace(log, tmp_path / "b.json")
    text = (tmp_path / "a.json").read_text()
    assert text == (tmp_path / "b.json").read_text()
    assert json.loads(text) == json.loads(json.dumps(chrome_trace(log)))
    assert json.loads(text)["displayTimeUnit"] == "ms"


def test_gantt_lanes_put_compute_first_and_every_rank_on_a_row():
    # receives are waiting time, not drawn: no recv lanes
    lanes = [(rank, stream) for rank, stream, _, _ in lane_layout(small_log())]
    assert lanes == [(0, "compute"), (0, "send"), (1, "compute"), (1, "send"), (2, "compute")]


def test_time_unit_follows_makespan():
    assert time_unit(5e-4) == ("us", 1e6)
    assert time_unit(7.25e-3) == ("ms", 1e3)
    assert time_unit(12.0) == ("s", 1.0)


def test_gantt_png_is_valid_and_byte_identical(tmp_path):
    log = small_log()
    plot_gantt(log, tmp_path / "a.png", "small")
    plot_gantt(log, tmp_path / "b.png", "small")
    data = (tmp_path / "a.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data == (tmp_path / "b.png").read_bytes()


def test_gantt_of_some_ranks_labels_only_their_boxes(tmp_path):
    """A run with more ranks than the chart draws: the other ranks' boxes have no lane to sit in."""
    log = small_log()
    drawn = sorted({s.rank for s in log.spans})[:1]
    plot_gantt(log, tmp_path / "some.png", "some", drawn)
    assert (tmp_path / "some.png").read_bytes()[:4] == b"\x89PNG"


def test_gantt_handles_an_empty_log_and_unknown_streams(tmp_path):
    plot_gantt(EventLog((), (), 2, ()), tmp_path / "empty.png", "empty")
    dp = EventLog((Span(0, "dp", "AR grads", "ALLREDUCE", None, 0, 0.0, 1.0),), (), 1, ())
    plot_gantt(dp, tmp_path / "dp.png", "dp")
    assert (tmp_path / "empty.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "dp.png").read_bytes()[:4] == b"\x89PNG"


def test_format_table_aligns_numbers_right_and_text_left():
    rows = [{"name": "1f1b", "time_s": 1.5, "bubble": 0.25}, {"name": "interleaved", "time_s": 12.25, "bubble": None}]
    columns = [("name", "schedule", "s"), ("time_s", "time (s)", ".2f"), ("bubble", "bubble", ".1%")]
    assert format_table(rows, columns) == (
        "schedule     time (s)  bubble\n"
        "-----------  --------  ------\n"
        "1f1b             1.50   25.0%\n"
        "interleaved     12.25       -"
    )


def test_trace_leaves_out_the_network_when_it_would_swamp_the_trace(monkeypatch):
    import clustersim.sim.results.trace as trace

    log = small_log()
    monkeypatch.setattr(trace, "MAX_FLOW_EVENTS", 0)
    events = chrome_trace(log)["traceEvents"]
    assert sum(1 for e in events if e["ph"] == "X") == len(log.spans)
    assert any("flows left out" in str(e.get("args", {}).get("name", "")) for e in events)


def test_gantt_gives_w_its_own_colour_between_b_and_opt():
    """A zero-bubble schedule's weight gradient is drawn and listed apart from its input gradient."""
    from clustersim.sim.views.gantt import phase_colours

    styles = phase_colours({"F", "B", "W", "OPT"})
    assert list(styles) == ["F", "B", "W", "OPT"]
    assert len({colour for colour, _ in styles.values()}) == 4
