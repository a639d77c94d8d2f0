"""The rank grid: tensor-parallel ranks consecutive by default, groups as slices."""

import numpy as np
import pytest

from clustersim.schedules.layout import Layout


def test_default_order_keeps_tensor_parallel_ranks_consecutive():
    layout = Layout(dp=2, pp=2, tp=2)
    assert layout.tp_group(0, 0) == (0, 1) and layout.tp_group(1, 1) == (6, 7)
    assert layout.pp_group(0, 1) == (1, 3)
    assert layout.dp_group(1, 0) == (2, 6)
    assert layout.coords(5) == (1, 0, 1)


def test_every_rank_appears_once_in_each_kind_of_group():
    layout = Layout(dp=3, pp=2, tp=4, order=("pp", "tp", "dp"))
    for groups in (
        [layout.tp_group(d, p) for d in range(3) for p in range(2)],
        [layout.pp_group(d, t) for d in range(3) for t in range(4)],
        [layout.dp_group(p, t) for p in range(2) for t in range(4)],
    ):
        assert sorted(r for g in groups for r in g) == list(range(24))
    # order ("pp", "tp", "dp"): dp varies fastest
    assert layout.dp_group(0, 0) == (0, 1, 2)


def test_grid_is_a_reshape_of_the_rank_range():
    layout = Layout(dp=2, pp=3, tp=2)
    assert (layout.grid == np.arange(12).reshape(2, 3, 2)).all()


def test_rejects_an_order_that_misses_an_axis():
    with pytest.raises(ValueError, match="must name each of"):
        Layout(1, 1, 1, order=("dp", "dp", "tp"))
