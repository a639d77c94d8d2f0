"""compare.png: each scenario's step as stacked bars beside its hottest links, a pure function of the rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

from clustersim.sim.results.breakdown import EXPOSED_KINDS
from clustersim.sim.results.table import time_unit

COLOURS = {
    "compute": "#4c72b0",
    "all_to_all": "#c44e52",
    "all_reduce": "#dd8452",
    "reduce_scatter": "#8172b3",
    "all_gather": "#937860",
    "p2p": "#55a868",
    "broadcast": "#da8bc3",
    "reduce": "#8c8c8c",
    "bubble": "#dddddd",
}
LINK_COLOURS = ("#00695c", "#26a69a", "#80cbc4")  # hottest, second, third: teals, apart from the breakdown's hues
LABEL_SHARE = 0.04  # a segment shorter than this share of the tallest bar gets no value label (it would not fit)


def plot_compare(rows: list[dict], path: str | Path, kinds: list[str], hottest: int) -> None:
    """Stacked step-time bars (compute, exposed comm by kind, bubble) beside each scenario's
    hottest links' utilisation; deterministic PNG bytes."""
    unit, scale = time_unit(max(r["step_time_s"] for r in rows))
    fig = Figure(figsize=(6 + 2.2 * len(rows), 5.5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.3]})
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for part in ["compute", *kinds, "bubble"]:
        values = (
            np.array([r["exposed_comm_s"][part] if part in EXPOSED_KINDS else r[f"{part}_s"] for r in rows]) * scale
        )
        label = part if part in ("compute", "bubble") else f"exposed {part}"
        left.bar(x, values, 0.6, bottom=bottom, color=COLOURS.get(part, "#999999"), label=label)
        for xi, value, base in zip(x, values, bottom):
            if value >= LABEL_SHARE * max(r["step_time_s"] for r in rows) * scale:
                ink = "white" if sum(to_rgb(COLOURS.get(part, "#999999"))) < 1.5 else "black"  # on a dark bar
                left.text(xi, base + value / 2, f"{value:.3g}", ha="center", va="center", fontsize=7, color=ink)
        bottom += values
    for xi, total in zip(x, bottom):
        left.text(xi, total, f"step {total:.4g} {unit}", ha="center", va="bottom", fontsize=8)
    left.set_ylim(0, 1.1 * float(bottom.max()))  # room for the totals
    left.set_xticks(x, [r["name"] + ("" if r["fits"] else "\n(does not fit)") for r in rows], fontsize=8)
    left.set_ylabel(f"mean per rank ({unit})")
    left.set_title("where the step goes", fontsize=10)
    left.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.06), ncols=3, frameon=False)
    width = 0.8 / hottest
    for i, r in enumerate(rows):
        for j, link in enumerate(r["hottest_links"]):
            xj = i - 0.4 + width * (j + 0.5)
            pct = 100 * link["utilisation"]
            right.bar(xj, pct, width * 0.9, color=LINK_COLOURS[j % len(LINK_COLOURS)])
            right.text(xj, pct, f" {link['link']} {pct:.3g}%", rotation=90, ha="center", va="bottom", fontsize=7)
        if not r["hottest_links"]:
            right.text(i, 1.0, "no traffic", rotation=90, ha="center", va="bottom", fontsize=7)
    right.set_xticks(x, [r["name"] + ("" if r["fits"] else "\n(does not fit)") for r in rows], fontsize=8)
    right.set_xlim(-0.6, len(rows) - 0.4)
    top = max((100 * link["utilisation"] for r in rows for link in r["hottest_links"]), default=1.0)
    right.set_ylim(0, 1.45 * top)  # room for the labels above the tallest bar
    right.set_ylabel("utilisation over the step (%)")
    right.set_title(f"{hottest} hottest links per scenario", fontsize=10)
    fig.savefig(path, format="png", metadata={"Software": None})
