"""The planner's pipeline playback against the closed forms of the schedules' papers (see
schedules/pipeline.py's docstring for their sources)."""

import pytest

from clustersim.sim.plan.timeline import play


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("pp", "m"), [(1, 1), (4, 8), (4, 3), (8, 16)])
def test_one_stage_per_rank_makespan_is_m_plus_p_minus_1_op_pairs(kind, pp, m):
    """GPipe and 1F1B: (m + p - 1)(t_F + t_B) with equal stage times and free communication."""
    assert play(kind, pp, m, 1, 1.0, 2.0).makespan == pytest.approx((m + pp - 1) * 3.0)


@pytest.mark.parametrize(("pp", "m", "v"), [(2, 4, 2), (4, 8, 2), (4, 8, 3), (8, 16, 4)])
def test_interleaved_makespan_shrinks_the_fill_by_v(pp, m, v):
    """Interleaved 1F1B with chunk times t_F / v, t_B / v: (v m + p - 1)(t_F + t_B) / v."""
    f, b = 1.0 / v, 2.0 / v
    assert play("interleaved", pp, m, v, f, b).makespan == pytest.approx((v * m + pp - 1) * (f + b))


def test_peak_inflight_microbatches():
    """GPipe holds all m microbatches; 1F1B's rank r holds min(p - r, m) (PipeDream-flush)."""
    assert play("gpipe", 4, 8, 1, 1.0, 2.0).peak_inflight == (8, 8, 8, 8)
    assert play("1f1b", 4, 8, 1, 1.0, 2.0).peak_inflight == (4, 3, 2, 1)
    assert play("1f1b", 4, 2, 1, 1.0, 2.0).peak_inflight == (2, 2, 2, 1)
