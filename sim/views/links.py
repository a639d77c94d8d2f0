"""links.png: utilisation over time of the hottest links (from the network's load timeline), and
the topology with every link coloured by its utilisation over the step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from clustersim.sim.network.records import LinkStats
from clustersim.sim.results.links import hottest_links, utilisation_matrix
from clustersim.sim.results.table import time_unit
from clustersim.sim.views.topology import draw_topology_on, load_colourbar, load_colours


def percent(fraction: float) -> str:
    """A share as a percentage a reader can tell from zero: 0.06% stays 0.06%, not 0%."""
    value = 100 * fraction
    return "0%" if value == 0 else f"{value:.2g}%" if value < 10 else f"{value:.0f}%"


def plot_links(stats: LinkStats, step_s: float, path: str | Path, title: str, graph=None) -> None:
    """Heatmap (hottest links x time) of utilisation above the topology coloured by load (when
    `graph` is given); deterministic PNG bytes."""
    links = hottest_links(stats)
    heat_h = 1.5 + 0.3 * max(len(links), 1)
    topo_h = 7.0 if graph is not None else 0.0
    fig = Figure(figsize=(12, heat_h + topo_h), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2 if graph is not None else 1, 1, height_ratios=[heat_h, topo_h] if topo_h else [1])
    ax = fig.add_subplot(grid[0])
    cmap, norm = load_colours()
    panels = [ax]
    if len(links) and step_s > 0:
        matrix = utilisation_matrix(stats, links, step_s)
        unit, scale = time_unit(step_s)
        ax.imshow(
            np.ma.masked_less_equal(matrix, 0.0),  # idle bins grey
            aspect="auto",
            interpolation="nearest",
            cmap=cmap,
            norm=norm,
            extent=(0.0, step_s * scale, len(links) - 0.5, -0.5),
        )
        ax.set_yticks(
            range(len(links)),
            [f"{stats.names[link]} ({percent(stats.utilisation[link])} of the step)" for link in links],
            fontsize=7,
        )
        ax.set_xlabel(f"time ({unit})")
    else:
        ax.text(0.5, 0.5, "no traffic on any link", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title, fontsize=10)
    if graph is not None:
        load = {link: float(u) for link, u in enumerate(stats.utilisation)}
        panels.append(fig.add_subplot(grid[1]))
        title = "topology, links coloured by utilisation over the step (max of both directions)"
        draw_topology_on(fig, panels[-1], graph, title, load, colourbar=False)
    load_colourbar(fig, panels)
    fig.savefig(path, metadata={"Software": None})
