"""trace.json's overlays: every message is one arrow from inside its send to inside its receive;
the memory counters reproduce the memory timeline's peaks; link counters are utilisations."""

import pytest

from clustersim.schedules.ir import Comm, Send
from clustersim.sim.results.links import link_stats
from clustersim.sim.results.memory import CATEGORIES, memory_peaks
from clustersim.sim.results.trace import chrome_trace, rank_pid
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario

from repo import QUICKSTART


@pytest.fixture(scope="module")
def run():
    result = simulate(load_scenario(QUICKSTART))
    trace = chrome_trace(result.log, program=result.program, memory=result.memory, links=link_stats(result.log))
    return result, trace["traceEvents"]


def test_every_message_is_one_arrow_from_its_send_to_its_receive(run):
    result, events = run
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    sends = sum(isinstance(op, Send) for ops in result.program.ops.values() for op in ops)
    assert sends > 0 and len(starts) == len(ends) == sends
    spans = [e for e in events if e["ph"] == "X" and e["cat"] in (Comm.SEND, Comm.RECV)]

    def inside(point, cat):
        return [
            s
            for s in spans
            if s["cat"] == cat
            and (s["pid"], s["tid"]) == (point["pid"], point["tid"])
            and s["ts"] <= point["ts"] <= s["ts"] + s["dur"]
        ]

    for arrow, start in starts.items():
        end = ends[arrow]
        # the message's tag names a SEND span around the start and a RECV span around the end
        # (a receive whose message had arrived takes no time: it sits on the boundary of others)
        sent = {span["name"].removeprefix("SEND ") for span in inside(start, Comm.SEND)}
        received = {span["name"].removeprefix("RECV ") for span in inside(end, Comm.RECV)}
        assert len(sent) == 1 and sent <= received, (sent, received)
        assert start["pid"] != end["pid"] and end["bp"] == "e"


def test_memory_counters_peak_where_the_memory_timeline_does(run):
    result, events = run
    peaks = memory_peaks(result.memory)
    for rank in range(result.log.num_ranks):
        counters = [e["args"] for e in events if e["ph"] == "C" and e["pid"] == rank_pid(rank)]
        assert set(counters[0]) == set(CATEGORIES)
        total = max(sum(c.values()) for c in counters)
        assert total == pytest.approx(peaks[str(rank)]["total"] / 1e9, rel=1e-12)


def test_link_counters_are_utilisations_of_the_hottest_links(run):
    result, events = run
    stats = link_stats(result.log)
    counters = [e for e in events if e["ph"] == "C" and e["name"].startswith("utilisation ")]
    times, links, loads = stats.timeline
    assert len(counters) == len(times) > 0
    assert {e["name"].removeprefix("utilisation ") for e in counters} == {stats.names[link] for link in set(links)}
    assert all(0 <= e["args"]["utilisation"] <= 1 + 1e-9 for e in counters)  # max-min fair: never over capacity
    assert max(e["args"]["utilisation"] for e in counters) == pytest.approx(1.0)  # a lone p2p flow fills its link
