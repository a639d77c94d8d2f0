"""The replays' bytes summed down a column equal the one-by-one loop bit for bit."""

import numpy as np

from clustersim.sim.network import summed
from clustersim.sim.network.summed import repeated_sum


def one_by_one(values: np.ndarray, times: int) -> np.ndarray:
    total = np.zeros(len(values))
    for _ in range(times):
        total += values
    return total


def test_repeated_sum_is_the_loop_bit_for_bit(monkeypatch):
    monkeypatch.setattr(summed, "REPEAT_ELEMENTS", 7 * 5)  # blocks of 7 replays of 5 sizes, the last one short
    values = np.array([0.1, 1e-3, 83886080.0 / 3, 2.0**-40, 1e16 + 1.0, 0.1, 1e-3])
    for times in (0, 1, 6, 7, 8, 50):
        got, want = repeated_sum(values, times), one_by_one(values, times)
        assert got.tobytes() == want.tobytes()
    assert not np.array_equal(one_by_one(values, 50), 50 * values)  # what a product would have got wrong
