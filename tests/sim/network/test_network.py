"""The flow-level network against closed forms: latency + bytes / rate, fair sharing, statistics."""

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.sim.network.network import Network
from clustersim.sim.results.links import utilisation_matrix
from clustersim.topologies.switch import switch

from transfers import landing_times

B, LAT = 100e9, 1e-6  # link bandwidth (B/s per direction) and per-link latency


def network(n=4):
    return Network(simpy.Environment(), switch(n, B, LAT))


def test_lone_message_takes_latency_plus_bytes_over_bandwidth():
    # two hops (GPU -> switch -> GPU): latency 2 x LAT
    assert landing_times(network(), [(0.0, 0, 1, 1e9)]) == [pytest.approx(2 * LAT + 1e9 / B, rel=1e-12)]


def test_two_messages_into_one_gpu_share_its_link():
    # both cross switch->gpu2: each gets B/2 until they finish together
    times = landing_times(network(), [(0.0, 0, 2, 1e9), (0.0, 1, 2, 1e9)])
    assert times == [pytest.approx(2 * LAT + 2e9 / B, rel=1e-12)] * 2


def test_late_starter_slows_the_first_then_speeds_up():
    # m0: 1 GB alone for 5 ms (0.5 GB done), then shares with m1 (0.25 GB) at B/2:
    # m1 needs 5 ms, m0 sends 0.25 GB more meanwhile, then its last 0.25 GB alone takes 2.5 ms.
    times = landing_times(network(), [(0.0, 0, 2, 1e9), (5e-3, 1, 2, 0.25e9)])
    assert times[1] == pytest.approx(5e-3 + 5e-3 + 2 * LAT, rel=1e-12)
    assert times[0] == pytest.approx(12.5e-3 + 2 * LAT, rel=1e-12)


def test_disjoint_paths_do_not_interfere():
    times = landing_times(network(), [(0.0, 0, 1, 1e9), (0.0, 2, 3, 1e9), (0.0, 1, 0, 1e9)])
    assert times == [pytest.approx(2 * LAT + 1e9 / B, rel=1e-12)] * 3


def test_zero_byte_message_pays_latency_only_and_self_message_nothing():
    assert landing_times(network(), [(0.0, 0, 1, 0.0), (0.0, 2, 2, 1e9)]) == [pytest.approx(2 * LAT), 0.0]


def test_transfer_many_fires_when_the_last_lands():
    net = network(4)
    done = net.transfer_many(np.array([0, 1, 2]), np.array([3, 3, 0]), np.array([1e9, 1e9, 3e9]), "bulk")
    net.env.run()
    assert done.triggered
    # 0->3 and 1->3 share switch->gpu3 (B/2 each, 20 ms); 2->0 alone takes 30 ms
    assert net.env.now == pytest.approx(2 * LAT + 3e9 / B, rel=1e-12)


def test_link_statistics():
    net = network(4)
    net.transfer_many(np.array([0, 1]), np.array([2, 2]), np.array([1e9, 1e9]), "bulk")
    net.env.run()
    stats = net.link_stats(net.env.now)
    into2 = stats.names.index("switch0->gpu2")
    assert stats.bytes[into2] == 2e9
    assert stats.peak_flows[into2] == 2
    assert stats.busy_s[into2] == pytest.approx(2e9 / B, rel=1e-12)
    assert stats.utilisation[into2] == pytest.approx(2e9 / (B * net.env.now), rel=1e-12)
    # the time-binned utilisation integrates back to the bytes moved
    matrix = utilisation_matrix(stats, np.array([into2]), net.env.now, bins=7)
    assert matrix.sum() * net.env.now / 7 * B == pytest.approx(2e9, rel=1e-9)


def check_max_min(flows) -> None:
    """Every re-share: no link over capacity; every living flow crosses a saturated link on
    which no flow gets a higher rate (the max-min condition)."""
    living = np.flatnonzero(flows.alive)
    load = np.zeros(len(flows.capacity_Bps))
    paths = {f: flows.flow_links[flows.flow_ptr[f] : flows.flow_ptr[f + 1]] for f in living}
    for f, links in paths.items():
        load[links] += flows.rate[f]
    assert (load <= flows.capacity_Bps * (1 + 1e-9)).all()
    best_on = np.zeros(len(load))
    for f, links in paths.items():
        best_on[links] = np.maximum(best_on[links], flows.rate[f])
    for f, links in paths.items():
        saturated = load[links] >= flows.capacity_Bps[links] * (1 - 1e-9)
        assert (saturated & (flows.rate[f] >= best_on[links] * (1 - 1e-9))).any(), f


@st.composite
def traffic(draw):
    n = draw(st.integers(3, 6))
    messages = draw(
        st.lists(
            st.tuples(st.floats(0, 5e-3), st.integers(0, n - 1), st.integers(0, n - 1), st.floats(1e6, 1e9)),
            min_size=1,
            max_size=25,
        )
    )
    return n, messages


@settings(max_examples=60, deadline=None)
@given(traffic(), st.sampled_from(["ring", "switch", "fattree"]))
def test_every_reshare_is_max_min_fair(case, kind):
    from clustersim.topologies.fattree import fat_tree
    from clustersim.topologies.ring import ring

    n, messages = case
    graph = {
        "ring": lambda: ring(n, B, LAT),
        "switch": lambda: switch(n, B, LAT),
        "fattree": lambda: fat_tree(n, 1, leaf_radix=2, latency_s=LAT),
    }[kind]()
    net = Network(simpy.Environment(), graph)
    checked = []
    original = net._after_fill

    def checked_fill():
        check_max_min(net._flows)
        checked.append(1)
        original()

    net._after_fill = checked_fill
    times = landing_times(net, messages)
    assert len(times) == len(messages)
    assert checked or all(src == dst for _, src, dst, _ in messages)
