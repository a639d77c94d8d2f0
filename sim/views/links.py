"""links.png: utilisation over time of the hottest links (from the network's load timeline), and
the topology with every link coloured by its utilisation over the step."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from clustersim.sim.network.records import LinkStats
from clustersim.sim.results.links import hottest_links, utilisation_matrix
from clustersim.sim.views.topology import draw_topology_on


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
    if len(links) and step_s > 0:
        matrix = utilisation_matrix(stats, links, step_s)
        unit, scale = (("ms", 1e3) if step_s < 1 else ("s", 1.0)) if step_s >= 1e-3 else ("us", 1e6)
        image = ax.imshow(
            matrix,
            aspect="auto",
            interpolation="nearest",
            cmap="inferno",
            vmin=0.0,
            vmax=1.0,
            extent=(0.0, step_s * scale, len(links) - 0.5, -0.5),
        )
        ax.set_yticks(
            range(len(links)),
            [f"{stats.names[link]} ({100 * stats.utilisation[link]:.0f}%)" for link in links],
            fontsize=7,
        )
        ax.set_xlabel(f"time ({unit})")
        fig.colorbar(image, ax=ax, label="utilisation")
    else:
        ax.text(0.5, 0.5, "no traffic on any link", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title, fontsize=10)
    if graph is not None:
        load = {link: float(u) for link, u in enumerate(stats.utilisation)}
        draw_topology_on(
            fig, fig.add_subplot(grid[1]), graph, "topology, links coloured by utilisation over the step", load
        )
    fig.savefig(path, metadata={"Software": None})
