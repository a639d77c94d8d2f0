"""A symmetric run's network solved once per orbit (sim.orbits, sim.few_flows) against moving every
flow: the same landing time for every message and the same link statistics, on random traffic
closed under shifts that map the fabric onto itself; the right shifts refused or left out."""

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.schedules.layout import Layout
from clustersim.sim.collectives.run import step_pairs
from clustersim.sim.network.few_flows import FewFlows
from clustersim.sim.network.flows import ActiveFlows
from clustersim.sim.network.network import Network
from clustersim.sim.scale.symmetry import Symmetry
from clustersim.topologies.fattree import fat_tree

from transfers import landing_times

NODES, PER_NODE = 4, 4
# leaf radix -> node shifts by multiples of this map the fat tree onto itself (whole leaf groups);
# with one group of four the 16 shifts outnumber the 4 leaf uplinks (orbits smaller than the group)
FABRICS = {2: 2, 4: 1}


def shifts(node_steps, rails) -> np.ndarray:
    """[shift, GPU] -> GPU: every node moved by a multiple of `node_steps`, every rail turned by
    0..rails-1 (rail-optimised: rail r of every node on leaf r of its group)."""
    gpu = np.arange(NODES * PER_NODE)
    node, rail = gpu // PER_NODE, gpu % PER_NODE
    return np.array(
        [
            ((node + a) % NODES) * PER_NODE + (rail + b) % PER_NODE
            for a in range(0, NODES, node_steps)
            for b in range(rails)
        ]
    )


def graph(radix=2):
    return fat_tree(NODES, PER_NODE, leaf_radix=radix, oversubscription=2, latency_s=1e-6, load_balance="adaptive")


def run(net, transfers):
    """Each (t, sources, destinations, bytes) as one transfer on the "send" stream; landing times."""
    return landing_times(net, transfers, label="send:m")


@st.composite
def symmetric_traffic(draw, image):
    """Transfers of a few messages each, every message with all its images under the shifts."""
    n = NODES * PER_NODE
    transfers = []
    for _ in range(draw(st.integers(1, 6))):
        pairs = draw(
            st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), min_size=1, max_size=3, unique=True)
        )
        src = np.array([s for s, _ in pairs])
        dst = np.array([d for _, d in pairs])
        nbytes = draw(st.one_of(st.just(0.0), st.floats(1e5, 1e8)))  # zero bytes: latency only
        start = draw(st.floats(0, 2e-3))
        full = np.unique(np.stack([image[:, src].ravel(), image[:, dst].ravel()], axis=1), axis=0)
        transfers.append((start, full[:, 0], full[:, 1], nbytes))
    return transfers


@pytest.mark.parametrize("radix", FABRICS)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_one_flow_per_orbit_gives_every_message_the_exact_landing_time(radix, data):
    image = shifts(FABRICS[radix], PER_NODE)
    transfers = data.draw(symmetric_traffic(image))
    exact = Network(simpy.Environment(), graph(radix))
    quotient = Network(simpy.Environment(), graph(radix), images=image)
    assert run(quotient, transfers) == pytest.approx(run(exact, transfers), rel=1e-9, abs=1e-15)
    window = exact.env.now
    a, b = exact.link_stats(window), quotient.link_stats(window)
    assert b.bytes == pytest.approx(a.bytes, rel=1e-9)
    assert b.busy_s == pytest.approx(a.busy_s, rel=1e-9, abs=1e-15)
    assert (b.peak_flows == a.peak_flows).all()
    fa, fb = exact.flow_table(), quotient.flow_table()
    oa, ob = np.lexsort((fa.end_s, fa.dst, fa.src)), np.lexsort((fb.end_s, fb.dst, fb.src))
    assert (fa.src[oa] == fb.src[ob]).all() and (fa.dst[oa] == fb.dst[ob]).all()
    assert fb.end_s[ob] == pytest.approx(fa.end_s[oa], rel=1e-9)
    assert fb.nbytes[ob] == pytest.approx(fa.nbytes[oa], rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_a_pair_sent_several_times_in_one_transfer_moves_as_many_flows(data):
    """An NCCL collective's channels each send their chunk over the same pair in one step: as many
    flows on the real network, each with its fair share. The quotient keeps the j-th message of a
    pair and the j-th of each of its images as one orbit, not every repeat of the pair as one."""
    image = shifts(FABRICS[2], PER_NODE)
    transfers = [
        (t, np.tile(src, copies), np.tile(dst, copies), nbytes)
        for (t, src, dst, nbytes), copies in zip(
            data.draw(symmetric_traffic(image)), data.draw(st.lists(st.integers(1, 4), min_size=6, max_size=6))
        )
    ]
    exact = Network(simpy.Environment(), graph(2))
    quotient = Network(simpy.Environment(), graph(2), images=image)
    assert run(quotient, transfers) == pytest.approx(run(exact, transfers), rel=1e-9, abs=1e-15)
    window = exact.env.now
    assert quotient.link_stats(window).bytes == pytest.approx(exact.link_stats(window).bytes, rel=1e-9)


def test_a_ring_s_channels_contend_with_another_group_as_on_the_real_network():
    """Found on a DGX-like run (tensor parallel 2, the distributed optimizer's all-gather on
    rails 0, 2, 4, 6 beside a tensor-parallel reduce-scatter): the channels' messages 0 -> 2 of
    one step took one flow in the quotient, so GPU 0's NVLink carried a fraction of the
    all-gather and the reduce-scatter ran as if alone. Here rails turned alike in every node."""
    image = shifts(NODES, PER_NODE)
    channels = 2

    def orbit(src, dst, copies=1):
        return np.tile(image[:, src].ravel(), copies), np.tile(image[:, dst].ravel(), copies)

    ring = orbit(np.array([0, 2]), np.array([2, 0]), channels)
    pair = orbit(np.array([0]), np.array([1]))
    rows = [(0.0, *ring, 4e7), (1e-5, *pair, 1e7)]
    exact = Network(simpy.Environment(), graph(2))
    quotient = Network(simpy.Environment(), graph(2), images=image)
    landed = run(exact, rows)
    assert run(quotient, rows) == pytest.approx(landed, rel=1e-12)
    alone = run(Network(simpy.Environment(), graph(2)), [(0.0, *pair, 1e7)])[0]
    # GPU 0's NVLink uplink carries the pair's flow beside four of the ring's (two channels, and
    # the images of 2 -> 0 under the turn by two): the pair runs at a fifth of the link at first
    assert landed[1] - 1e-5 > 2 * alone


def test_shifts_that_do_not_map_the_fabric_onto_itself_are_refused():
    """Moving nodes by one crosses leaf groups: a message inside a group has an image across two."""
    net = Network(simpy.Environment(), graph(), images=shifts(1, 1))
    with pytest.raises(ValueError, match="not symmetric"):
        run(net, [(0.0, np.array([0]), np.array([PER_NODE]), 1e6)])


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_few_flows_share_like_the_array_flows(data):
    """Random paths on random capacities, flows arriving and leaving: both keep the same rates
    and finish times after every change."""
    num_links = data.draw(st.integers(2, 8))
    capacity = np.array(data.draw(st.lists(st.floats(1.0, 10.0), min_size=num_links, max_size=num_links)))
    few, arrays = FewFlows(capacity), ActiveFlows(capacity)
    ids = {}
    now = 0.0
    for _ in range(data.draw(st.integers(1, 8))):
        now += 0.1
        alive = [f for f in ids if f in few._flows]
        if alive and data.draw(st.booleans()):
            gone = data.draw(st.lists(st.sampled_from(alive), min_size=1, unique=True))
            few.finish(gone, now)
            arrays.finish(np.array([ids[f] for f in gone]), now)
        else:
            paths = data.draw(
                st.lists(
                    st.lists(st.integers(0, num_links - 1), min_size=1, max_size=4, unique=True), min_size=1, max_size=3
                )
            )
            ptr = np.cumsum([0] + [len(p) for p in paths])
            links = np.array([link for p in paths for link in p])
            n = len(paths)
            columns = dict(
                nbytes=np.full(n, 1e3),
                latency=np.zeros(n),
                start=np.full(n, now),
                src=np.zeros(n, int),
                dst=np.ones(n, int),
                group=np.zeros(n, int),
            )
            new = few.add(ptr, links, **columns)
            ids.update(zip(new, arrays.add(ptr, links, **columns).tolist()))
            few.fill_component(new, now)
            arrays.fill_component(np.array([ids[f] for f in new]), now)
        alive = [f for f in ids if f in few._flows]
        if alive:
            assert few.take(alive, "rate") == pytest.approx(
                arrays.take(np.array([ids[f] for f in alive]), "rate"), rel=1e-12
            )
            assert few.take(alive, "finish_at") == pytest.approx(
                arrays.take(np.array([ids[f] for f in alive]), "finish_at"), rel=1e-12
            )


def test_a_path_that_crosses_a_link_twice_counts_twice_on_it():
    """Capacities (2, 1); A crosses link 0, B crosses 0 and 1 twice (a quotient flow whose route
    meets one link orbit twice). B is bound by link 1 at 1 / 2; A takes what B leaves of link 0."""
    few = FewFlows(np.array([2.0, 1.0]))
    n = 2
    ids = few.add(
        np.array([0, 1, 4]),
        np.array([0, 0, 1, 1]),
        nbytes=np.ones(n),
        latency=np.zeros(n),
        start=np.zeros(n),
        src=np.zeros(n, int),
        dst=np.ones(n, int),
        group=np.zeros(n, int),
    )
    few.fill_component(ids, 0.0)
    assert few.take(ids, "rate").tolist() == [1.5, 0.5]
    assert few.loads(np.array([0, 1])).tolist() == [2.0, 1.0]


def test_a_group_a_shift_maps_onto_itself_keeps_the_shift_only_if_its_steps_are_whole_orbits():
    """dp 4 x tp 4 on a switch: a ring over the four replicas is turned onto itself by the replica
    shifts; halving-doubling is not (0 <-> 1 turned by one is 1 <-> 2), so those shifts go."""
    from clustersim.topologies.switch import switch

    symmetry = Symmetry(Layout(dp=4, pp=1, tp=4))
    g = switch(16, 100e9, 1e-6)
    group = tuple(int(r) for r in Layout(dp=4, pp=1, tp=4).grid[:, 0, 0])
    ring = symmetry.network_images([(group, step_pairs(g, "all_reduce", "ring", group, 1e6))])
    assert len(ring) == 16
    hd = symmetry.network_images([(group, step_pairs(g, "all_reduce", "halving_doubling", group, 1e6))])
    assert len(hd) == 4
    assert sorted(map(tuple, hd.tolist())) == sorted(
        tuple(row) for row, (a, _) in zip(symmetry.image.tolist(), symmetry.shifts) if a == 0
    )


def test_past_the_listing_limit_orbit_messages_are_summed_by_pair_and_stream(monkeypatch):
    """A huge run's flow table sums its orbits' messages per (src, dst, stream): the bytes each
    pair sent per stream are the listed ones; the timeline kept for the hottest links is theirs."""
    import clustersim.sim.network.ledger as ledger_module

    image = shifts(2, PER_NODE)
    transfers = [
        (t, *(image[:, [s]].ravel(), image[:, [d]].ravel()), nbytes)
        for t, s, d, nbytes in [(0.0, 0, 5, 3e6), (1e-5, 1, 9, 2e6), (2e-5, 0, 5, 1e6)]
    ]

    def totals(limit):
        monkeypatch.setattr(ledger_module, "LISTED_MESSAGES_MAX", limit)
        net = Network(simpy.Environment(), graph(), images=image)
        run(net, transfers)
        src, dst, nbytes, label = net.flow_table().totals()
        return np.bincount(src * 16 + dst, weights=nbytes, minlength=256), net

    listed, net = totals(10**9)
    summed, _ = totals(0)
    assert summed == pytest.approx(listed, rel=1e-12)
    assert listed.sum() == pytest.approx(len(image) * 6e6)
    monkeypatch.setattr(ledger_module, "TIMELINE_LINKS", net.num_links)
    full = net.link_stats(net.env.now)
    monkeypatch.setattr(ledger_module, "TIMELINE_LINKS", 8)
    hot = net.link_stats(net.env.now)
    kept = np.isin(full.timeline[1], hot.timeline[1])
    assert np.unique(hot.timeline[1]).size == min(8, np.unique(full.timeline[1]).size)
    assert all((a[kept] == b).all() for a, b in zip(full.timeline, hot.timeline))


def test_a_start_on_links_of_its_own_refills_only_the_new_flow():
    """NICs 0 and 1 (1 B/s each) under a shared spine link 2. A crosses 0 and 2, then B crosses
    1 and 2: with a 10 B/s spine each is bound by its own NIC at 1 and B is filled alone (the
    spine stays unsaturated, so A's bottleneck is untouched); with a 1.5 B/s spine B alone would
    saturate it, so both are filled again and share it, 0.75 each; when B leaves, A, bound on
    the spine B saturated, gets its NIC's 1 back."""

    def start(few: FewFlows, path: list[int]) -> list[int]:
        columns = {k: np.zeros(1) for k in ("latency", "start")} | {
            k: np.zeros(1, int) for k in ("src", "dst", "group")
        }
        ids = few.add(np.array([0, len(path)]), np.array(path), nbytes=np.ones(1), **columns)
        few.fill_component(ids, 0.0)
        return ids

    wide = FewFlows(np.array([1.0, 1.0, 10.0]))
    a = start(wide, [0, 2])
    b = start(wide, [1, 2])
    assert wide.last_refilled == 1
    assert wide.take(a + b, "rate").tolist() == [1.0, 1.0]
    narrow = FewFlows(np.array([1.0, 1.0, 1.5]))
    a = start(narrow, [0, 2])
    b = start(narrow, [1, 2])
    assert narrow.last_refilled == 2
    assert narrow.take(a + b, "rate").tolist() == [0.75, 0.75]
    narrow.finish(b, 0.0)
    assert narrow.last_refilled == 1
    assert narrow.take(a, "rate").tolist() == [1.0]
