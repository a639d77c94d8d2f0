"""Max-min fairness of progressive filling: property tests over random incidences, and small
cases solved by hand."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.sim.network.maxmin import concat_ranges, fill, link_csr, max_min_rates, rates_that_survive


def rates_for(paths: list[list[int]], capacity: list[float]) -> np.ndarray:
    ptr = np.zeros(len(paths) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in paths], out=ptr[1:])
    links = np.array([link for p in paths for link in p], dtype=np.int64)
    link_ptr, link_flows = link_csr(ptr, links, len(capacity))
    return max_min_rates(ptr, links, link_ptr, link_flows, np.array(capacity, dtype=float))


@st.composite
def incidences(draw):
    num_links = draw(st.integers(1, 12))
    capacity = draw(st.lists(st.floats(0.5, 100.0), min_size=num_links, max_size=num_links))
    paths = draw(
        st.lists(st.lists(st.integers(0, num_links - 1), min_size=1, max_size=5, unique=True), min_size=1, max_size=25)
    )
    return paths, capacity


@settings(max_examples=300, deadline=None)
@given(incidences())
def test_no_link_over_capacity_and_every_flow_has_a_bottleneck(case):
    paths, capacity = case
    rates = rates_for(paths, capacity)
    load = np.zeros(len(capacity))
    for path, rate in zip(paths, rates):
        load[path] += rate
    assert (rates > 0).all()
    assert (load <= np.array(capacity) * (1 + 1e-9)).all()
    for i, path in enumerate(paths):
        # a saturated link on the path where no flow gets more than flow i
        assert any(
            load[link] >= capacity[link] * (1 - 1e-9)
            and all(rates[j] <= rates[i] * (1 + 1e-9) for j, p in enumerate(paths) if link in p)
            for link in path
        ), (i, path)


def test_textbook_example():
    # Links A (cap 1) and B (cap 2); flow 0 uses A and B, flow 1 uses A, flow 2 uses B.
    # A fills first at 1/2 for flows 0 and 1; flow 2 gets B's rest, 2 - 1/2.
    assert rates_for([[0, 1], [0], [1]], [1.0, 2.0]).tolist() == [0.5, 0.5, 1.5]


def test_equal_flows_split_a_link_evenly():
    assert rates_for([[0]] * 4, [8.0]).tolist() == [2.0] * 4


def test_concat_ranges():
    assert concat_ranges(np.array([0, 5, 2]), np.array([2, 5, 5])).tolist() == [0, 1, 2, 3, 4]


@settings(max_examples=300, deadline=None)
@given(incidences(), st.data())
def test_refilling_after_flows_leave_equals_a_fresh_fill(case, data):
    paths, capacity = case
    rates = rates_for(paths, capacity)
    leaving = np.array(data.draw(st.lists(st.booleans(), min_size=len(paths), max_size=len(paths))))
    stay = [p for p, gone in zip(paths, leaving) if not gone]
    if not stay:
        return
    fresh = rates_for(stay, capacity)
    ptr = np.zeros(len(stay) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in stay], out=ptr[1:])
    links = np.array([link for p in stay for link in p], dtype=np.int64)
    link_ptr, link_flows = link_csr(ptr, links, len(capacity))
    keep = rates_that_survive(rates, leaving)[~leaving]
    resumed = np.where(keep, rates[~leaving], 0.0)
    on_kept = np.repeat(keep, np.diff(ptr))
    residual = np.maximum(
        np.array(capacity)
        - np.bincount(links[on_kept], weights=np.repeat(resumed, np.diff(ptr))[on_kept], minlength=len(capacity)),
        0.0,
    )
    unfrozen_on = np.bincount(links[~on_kept], minlength=len(capacity)).astype(float)
    fill(ptr, links, link_ptr, link_flows, residual, unfrozen_on, keep.copy(), resumed)
    np.testing.assert_allclose(resumed, fresh, rtol=1e-9)


def test_component_follows_shared_links_transitively():
    from clustersim.sim.network.flows import ActiveFlows

    flows = ActiveFlows(np.ones(5))
    paths = [[0, 1], [1, 2], [3], [2, 4]]  # 0-1 share link 1, 1-3 share link 2; flow 2 stands alone
    ptr = np.zeros(5, dtype=np.int64)
    np.cumsum([len(p) for p in paths], out=ptr[1:])
    n = len(paths)
    flows.add(
        ptr,
        np.array([link for p in paths for link in p]),
        nbytes=np.ones(n),
        latency=np.zeros(n),
        start=np.zeros(n),
        src=np.zeros(n, np.int64),
        dst=np.ones(n, np.int64),
        group=np.zeros(n, np.int64),
    )
    assert flows.component(np.array([0])).tolist() == [0, 1, 3]
    assert flows.component(np.array([2])).tolist() == [2]
    flows.fill_component(np.arange(n), 0.0)
    fresh = rates_for(paths, [1.0] * 5)
    np.testing.assert_allclose(flows.rate, fresh)
