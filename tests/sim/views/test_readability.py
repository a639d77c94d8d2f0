"""Plots people read without squinting: no text falls outside its figure (a clipped title), one
colour bar on links.png, a linear traffic scale for even traffic and a log one for uneven."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from clustersim.sim.compare import compare_row
from clustersim.sim.results.breakdown import EXPOSED_KINDS
from clustersim.sim.results.links import link_stats
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario
from clustersim.sim.views.compare import plot_compare
from clustersim.sim.views.gantt import plot_gantt
from clustersim.sim.views.links import plot_links
from clustersim.sim.views.memory import plot_memory
from clustersim.sim.views.traffic import norm_GB, plot_traffic

from repo import QUICKSTART


@pytest.fixture(scope="module")
def result():
    return simulate(load_scenario(QUICKSTART))


@pytest.fixture
def figures(monkeypatch):
    """Every figure a plot saves, drawn, so its text can be measured."""
    saved: list[Figure] = []
    original = Figure.savefig

    def keep(fig, *args, **kwargs):
        saved.append(fig)
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return saved


def overflow_in(fig: Figure) -> float:
    """How far (inches) what the figure draws reaches past its edges: its tight box (every drawn
    artist: titles, labels, tick labels, legends) against its size; 0 when nothing is clipped."""
    fig.canvas.draw()
    tight = fig.get_tightbbox(fig.canvas.get_renderer())
    width, height = fig.get_size_inches()
    return max(0.0, -tight.x0, -tight.y0, tight.x1 - width, tight.y1 - height)


def test_no_plot_clips_its_text(result, figures, tmp_path):
    long_title = "a scenario with a long name: " + ", ".join(f"rank {r}" for r in range(60))
    plot_gantt(result.log, tmp_path / "gantt.png", long_title)
    plot_links(link_stats(result.log), result.summary["step_time_s"], tmp_path / "links.png", "links", result.graph)
    plot_memory(result.memory, 80e9, tmp_path / "memory.png", "memory")
    plot_traffic(result.log, 4, tmp_path / "traffic.png", "traffic")
    rows = [compare_row(result) | {"name": name} for name in ("one", "two")]
    plot_compare(rows, tmp_path / "compare.png", [k for k in EXPOSED_KINDS if rows[0]["exposed_comm_s"][k] > 0], 3)
    assert len(figures) == 5
    for fig in figures:
        assert overflow_in(fig) < 0.02, fig.texts or [ax.get_title() for ax in fig.axes]


def test_links_png_has_one_colour_bar_for_both_panels(result, figures, tmp_path):
    plot_links(link_stats(result.log), result.summary["step_time_s"], tmp_path / "links.png", "links", result.graph)
    (fig,) = figures
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(bars) == 1
    assert bars[0].get_yscale() == "log"  # light loads get their own decades


def test_traffic_scale_is_linear_when_even_and_log_when_not():
    even = np.array([[0.0, 2e9], [2.2e9, 0.0]])
    uneven = np.array([[0.0, 2e9], [1e6, 0.0]])
    assert not isinstance(norm_GB([even]), LogNorm) and norm_GB([even]).vmin == 0.0
    assert isinstance(norm_GB([uneven]), LogNorm) and norm_GB([uneven]).vmin == pytest.approx(1e-3)
