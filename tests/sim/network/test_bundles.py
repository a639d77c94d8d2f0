"""Bundles (sim.network.bundles) against the flows they stand for moved one by one (FewFlows):
the same rates, finish times, batches, link loads and counts, bit for bit, after every change."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.sim.network.bundles import BundledFlows
from clustersim.sim.network.few_flows import FewFlows


def columns(n: int, nbytes: float, now: float) -> dict:
    return dict(
        nbytes=np.full(n, nbytes),
        latency=np.full(n, 1e-6),
        start=np.full(n, now),
        src=np.zeros(n, int),
        dst=np.ones(n, int),
        group=np.zeros(n, int),
    )


def csr(paths: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    return np.cumsum([0] + [len(p) for p in paths]), np.array([link for p in paths for link in p])


def start(few: FewFlows, bundled: BundledFlows, paths: list[list[int]], nbytes: float, now: float) -> None:
    """The pattern on both: FewFlows adds and fills its flows; BundledFlows bundles them if it can."""
    ptr, links = csr(paths)
    ids = few.add(ptr, links, **columns(len(paths), nbytes, now))
    few.fill_component(ids, now)
    cols = columns(len(paths), nbytes, now)
    del cols["start"], cols["group"]
    template = BundledFlows.template(bundled.capacity_Bps, ptr, links, cols)
    if template is None or bundled.start(template, now, 0) is None:
        ids = bundled.add(ptr, links, **columns(len(paths), nbytes, now))
        bundled.fill_component(ids, now)


def flows_of(bundled: BundledFlows, ids: list[int]) -> list[int]:
    """The flow ids that bundled ids stand for."""
    return [i + j for i, k in zip(ids, bundled.weights(ids).tolist()) for j in range(k)]


def assert_same(few: FewFlows, bundled: BundledFlows, num_links: int) -> None:
    alive = list(few._flows)
    ids = list(bundled._flows)
    assert flows_of(bundled, ids) == alive
    weights = bundled.weights(ids)
    for name in ("rate", "finish_at", "nbytes"):
        assert few.take(alive, name).tolist() == np.repeat(bundled.take(ids, name), weights).tolist()
    every = np.arange(num_links)
    assert few.loads(every).tolist() == bundled.loads(every).tolist()
    assert few.counts(every).tolist() == bundled.counts(every).tolist()
    assert few.touched.tolist() == bundled.touched.tolist()
    assert few.loads(few.touched).tolist() == bundled.loads(bundled.touched).tolist()  # what the ledger is told
    assert few.counts(few.touched).tolist() == bundled.counts(bundled.touched).tolist()
    assert few.last_refilled == bundled.last_refilled


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_bundles_move_bit_for_bit_as_their_flows_would(data):
    """Recurring patterns of a few paths started at random times on random capacities, the
    earliest finishers finished in between: every step leaves both in the same state."""
    num_links = data.draw(st.integers(3, 8))
    capacity = np.array(data.draw(st.lists(st.floats(1.0, 10.0), min_size=num_links, max_size=num_links)))
    path = st.lists(st.integers(0, num_links - 1), min_size=1, max_size=3, unique=True)
    patterns = data.draw(st.lists(st.lists(path, min_size=1, max_size=3), min_size=1, max_size=3))
    few, bundled = FewFlows(capacity), BundledFlows(capacity)
    now = 0.0
    for _ in range(data.draw(st.integers(1, 12))):
        if few._flows and data.draw(st.booleans()):
            delay, gone = few.next_finish(now, 1e-9)
            bundled_delay, bundled_gone = bundled.next_finish(now, 1e-9)
            assert (delay, gone) == (bundled_delay, flows_of(bundled, bundled_gone))
            now += delay
            few.finish(gone, now)
            bundled.finish(bundled_gone, now)
        else:
            now += data.draw(st.sampled_from([0.0, 1e2]))
            p = data.draw(st.integers(0, len(patterns) - 1))
            start(few, bundled, patterns[p], 1e3 * (p + 1), now)
        assert_same(few, bundled, num_links)


def test_a_start_on_a_bundles_link_expands_it_and_a_mixed_batch_finishes_alike():
    """Two flows on NICs of their own (links 0 and 1, 1 B/s) start as one bundle; a third on link
    1 and link 2 (1 B/s) expands it and the two on link 1 share it, 0.5 each; the bundle's other
    flow keeps its NIC's 1 B/s. The first to finish (link 0's) leaves with no refill."""
    capacity = np.ones(3)
    few, bundled = FewFlows(capacity), BundledFlows(capacity)
    start(few, bundled, [[0], [1]], 1.0, 0.0)
    assert list(bundled._flows) == [0] and bundled.weights([0]).tolist() == [2]
    assert_same(few, bundled, 3)
    start(few, bundled, [[1, 2]], 1.0, 0.0)
    assert list(bundled._flows) == [0, 1, 2]
    assert bundled.take([0, 1, 2], "rate").tolist() == [1.0, 0.5, 0.5]
    assert_same(few, bundled, 3)
    for flows in (few, bundled):
        flows.finish(flows.next_finish(0.0, 1e-9)[1], 1.0)
    assert_same(few, bundled, 3)
