"""A topology graph as a PNG: nodes coloured by kind, each duplex link drawn once, optionally
coloured by its load. A pure function of the graph (and the load), byte-identical for the same input.

Layouts, by what the graph says it is (topologies.schema graph attributes):
- ring, or any one-axis torus: a circle; a one-axis mesh: a line.
- 2D torus/mesh: the grid, axis 0 down, axis 1 across. 3D: one sheared k1 x k2 grid per axis-0
  layer, layers stacked upwards (an oblique projection). Wraparound links are dashed.
- fabrics of routers (dragonfly): routers round a circle in id order (so a group's routers sit
  together), each router's GPUs just outside it; router-to-router links are chords.
- everything else (switch, dgx, fat tree): layers by kind, GPUs in index order along the bottom
  (a gap between nodes), NVSwitch under its GPUs, NIC over its GPU, then leaf, spine and core rows.
With `link_load` (link id -> utilisation 0..1, a link id being the edge's position in
list(graph.edges)), a duplex link takes the larger of its two directions; links without a value are 0.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from clustersim.topologies.schema import AXES, GPU_INDEX, KIND, NODE_KINDS, WRAP

KIND_COLOURS = {
    "gpu": "#3b6fb6",
    "nvswitch": "#3f9b57",
    "switch": "#3f9b57",
    "nic": "#d9954a",
    "leaf": "#8c6bb1",
    "spine": "#c0504d",
    "core": "#7f7f7f",
    "router": "#17becf",
}
KIND_LEVEL = {
    "nvswitch": -1.0,
    "gpu": 0.0,
    "switch": 1.5,
    "nic": 1.0,
    "leaf": 2.5,
    "spine": 4.0,
    "core": 5.5,
    "router": 4.0,
}
LOAD_CMAP = "plasma"
IDLE_COLOUR = "#cfcfcf"  # a link that carried nothing
LOWEST_SHOWN = 1e-3  # utilisation at the bottom of the log colour scale; anything lower but > 0 gets its colour


def load_colours():
    """(colormap, norm) of link utilisation, shared by every panel that colours links: a log
    scale from 0.1% to 100%, so a lightly used link is not lost in the dark end, and grey for an
    idle one (0 is masked by the log scale and drawn in the colormap's "bad" colour)."""
    cmap = colormaps[LOAD_CMAP].with_extremes(bad=IDLE_COLOUR, under=colormaps[LOAD_CMAP](0.0))
    return cmap, LogNorm(LOWEST_SHOWN, 1.0)


def load_colourbar(fig: Figure, axes) -> None:
    """One colour bar of load_colours for `axes` (one axis or a list)."""
    cmap, norm = load_colours()
    fig.colorbar(
        ScalarMappable(norm=norm, cmap=cmap), ax=axes, extend="min", label="link utilisation (log scale; grey: idle)"
    )


DPI = 120
MAX_LABELLED_GPUS = 32


def layout(graph) -> dict:
    """node -> (x, y)."""
    if AXES in graph.graph:
        return _grid_layout(graph, tuple(graph.graph[AXES]), bool(graph.graph.get(WRAP, True)))
    if any(kind == "router" for _, kind in graph.nodes(data=KIND)):
        return _radial_layout(graph)
    return _layered_layout(graph)


def _radial_layout(graph) -> dict:
    routers = sorted(n for n, d in graph.nodes(data=True) if d[KIND] == "router")
    pos = {n: (0.0, 0.0) for n in graph.nodes}
    sector = 2 * math.pi / max(len(routers), 1)
    for i, router in enumerate(routers):
        angle = math.pi / 2 - sector * i
        pos[router] = (math.cos(angle), math.sin(angle))
        gpus = sorted((graph.nodes[n][GPU_INDEX], n) for n in graph.successors(router) if graph.nodes[n][KIND] == "gpu")
        for j, (_, gpu) in enumerate(gpus):  # spread over 80% of the router's sector
            a = angle - sector * 0.8 * ((j + 0.5) / len(gpus) - 0.5)
            pos[gpu] = (1.3 * math.cos(a), 1.3 * math.sin(a))
    return pos


def _grid_layout(graph, axes: tuple[int, ...], wrap: bool) -> dict:
    pos = {}
    for node, data in graph.nodes(data=True):
        c = np.unravel_index(data[GPU_INDEX], axes)
        if len(axes) == 1:
            angle = math.pi / 2 - 2 * math.pi * c[0] / axes[0]
            pos[node] = (math.cos(angle), math.sin(angle)) if wrap else (float(c[0]), 0.0)
        elif len(axes) == 2:
            pos[node] = (float(c[1]), -float(c[0]))
        else:  # layer c0, sheared grid: axis 2 across, axis 1 up-and-right
            shear, layer_gap = 0.45, 0.45 * (axes[1] - 1) + 1.2
            pos[node] = (c[2] + shear * c[1], shear * c[1] + layer_gap * c[0])
    return pos


def _layered_layout(graph) -> dict:
    gpus = sorted((d[GPU_INDEX], n) for n, d in graph.nodes(data=True) if d[KIND] == "gpu")
    node_of = {n: next((m for m in graph.successors(n) if graph.nodes[m][KIND] == "nvswitch"), None) for _, n in gpus}
    pos, x, previous = {}, 0.0, None
    for _, n in gpus:  # a gap wherever the NVSwitch (the node) changes
        if previous is not None and node_of[n] != node_of[previous]:
            x += 1.0
        pos[n], previous, x = (x, 0.0), n, x + 1.0
    width = max(x - 1.0, 1.0)
    rows: dict[str, list] = {}
    for n, d in graph.nodes(data=True):
        if d[KIND] in ("nvswitch", "nic"):  # under / over its GPUs
            xs = [pos[m][0] for m in graph.successors(n) if m in pos]
            pos[n] = (float(np.mean(xs)) if xs else 0.0, KIND_LEVEL[d[KIND]])
        elif d[KIND] != "gpu":
            rows.setdefault(d[KIND], []).append(n)
    for kind, nodes in rows.items():
        nodes = sorted(nodes, key=_sort_key)
        xs = np.linspace(0.0, width, len(nodes) + 2)[1:-1].tolist() if len(nodes) > 1 else [width / 2]
        for n, xi in zip(nodes, xs):
            pos[n] = (float(xi), KIND_LEVEL.get(kind, 6.0))
    return pos


def _sort_key(node):
    """Fat-tree leaves ("leaf", rail, group) sort by group then rail; other ids as they are."""
    if isinstance(node, tuple) and node[:1] == ("leaf",):
        return (node[0], node[2], node[1])
    return node if isinstance(node, tuple) else (str(node),)


def _duplex_links(graph, link_load: dict | None):
    """[(u, v, load or None, wraps)] one entry per unordered pair, in edge order."""
    ids = {edge: i for i, edge in enumerate(graph.edges)}
    axes = graph.graph.get(AXES)
    out, seen = [], set()
    for (u, v), i in ids.items():
        if (v, u) in seen:
            continue
        seen.add((u, v))
        load = None
        if link_load is not None:
            load = max(link_load.get(i, 0.0), link_load.get(ids.get((v, u), -1), 0.0))
        wraps = False
        if axes is not None:
            cu = np.unravel_index(graph.nodes[u][GPU_INDEX], axes)
            cv = np.unravel_index(graph.nodes[v][GPU_INDEX], axes)
            wraps = len(axes) > 1 and any(abs(int(a) - int(b)) > 1 for a, b in zip(cu, cv))
        out.append((u, v, load, wraps))
    return out


def _arc(p, q, samples: int = 17) -> np.ndarray:
    """A wraparound link as a bow from p to q, so it does not hide the straight links it spans."""
    p, q = np.asarray(p, float), np.asarray(q, float)
    t = np.linspace(0.0, 1.0, samples)[:, None]
    d = q - p
    normal = np.array([-d[1], d[0]]) / max(np.hypot(*d), 1e-12)
    return p + t * d + normal * 0.3 * 4 * t * (1 - t)  # bulges 0.3 grid steps sideways


def draw_topology(graph, path: str | Path, title: str, link_load: dict | None = None) -> None:
    """Write the graph as a PNG to `path` (see the module docstring for layouts and colours)."""
    fig = Figure(figsize=(10, 7), dpi=DPI)
    FigureCanvasAgg(fig)
    draw_topology_on(fig, fig.add_subplot(), graph, title, link_load)
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})


def draw_topology_on(fig: Figure, ax, graph, title: str, link_load: dict | None = None, colourbar: bool = True) -> None:
    """Draw the graph into `ax` of `fig` (for figures with other panels, e.g. links.png, which
    draws one colour bar for all of them: `colourbar` False)."""
    pos = layout(graph)
    links = _duplex_links(graph, link_load)
    num_gpus = sum(1 for _, d in graph.nodes(data=True) if d[KIND] == "gpu")
    cmap, norm = load_colours()
    for wraps in (False, True):
        chosen = [link for link in links if link[3] == wraps]
        if not chosen:
            continue
        segments = [_arc(pos[u], pos[v]) if wraps else (pos[u], pos[v]) for u, v, _, _ in chosen]
        if link_load is None:
            colours = ["#9a9a9a"] * len(chosen)
        else:
            colours = [cmap(norm(min(load, 1.0))) if load > 0 else IDLE_COLOUR for _, _, load, _ in chosen]
        width = 1.6 if link_load is not None else 0.8
        ax.add_collection(
            LineCollection(
                segments,
                colors=colours,
                linewidths=width,
                zorder=1,
                linestyles="--" if wraps else "-",
                alpha=0.6 if wraps else 0.9,
            )
        )
    size = max(6.0, 120.0 / math.sqrt(max(graph.number_of_nodes(), 1)))
    handles = []
    for kind in NODE_KINDS:
        nodes = [n for n, d in graph.nodes(data=True) if d[KIND] == kind]
        if not nodes:
            continue
        xy = np.array([pos[n] for n in nodes])
        ax.scatter(
            xy[:, 0],
            xy[:, 1],
            s=size**2 / 4,
            c=KIND_COLOURS.get(kind, "#000000"),
            zorder=2,
            edgecolors="white",
            linewidths=0.4,
        )
        handles.append(
            Line2D(
                [],
                [],
                marker="o",
                linestyle="",
                color=KIND_COLOURS.get(kind, "#000000"),
                label=f"{kind} ({len(nodes)})",
            )
        )
    if num_gpus <= MAX_LABELLED_GPUS:
        for n, d in graph.nodes(data=True):
            if d[KIND] == "gpu":
                ax.annotate(str(d[GPU_INDEX]), pos[n], fontsize=6, ha="center", va="center", color="white", zorder=3)
    if link_load is not None and colourbar:
        load_colourbar(fig, ax)
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0) if link_load is None else (0.0, -0.02),
        fontsize=8,
        frameon=False,
        ncol=1 if link_load is None else len(handles),
    )
    ax.set_title(title, fontsize=10)
    xy = np.array(list(pos.values()), dtype=float).reshape(-1, 2)
    flat = bool((np.ptp(xy, axis=0) == 0).any())  # one node, or all in one row: no shape to keep
    if not flat and (AXES in graph.graph or any(kind == "router" for _, kind in graph.nodes(data=KIND))):
        # grids and circles keep their shape; layered fabrics use the whole width
        ax.set_aspect("equal", adjustable="datalim")
    ax.autoscale_view()
    ax.margins(0.05)
    for get, put in ((ax.get_xlim, ax.set_xlim), (ax.get_ylim, ax.set_ylim)):
        low, high = get()
        if low == high:  # a flat axis gets a unit span (matplotlib would warn and widen it itself)
            put(low - 0.5, high + 0.5)
    ax.set_axis_off()
