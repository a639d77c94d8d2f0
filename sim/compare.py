"""`clustersim compare`: where each scenario's step time goes, side by side (the breakdown's
definition is in sim/results/breakdown.py), as compare.json, compare.md and compare.png."""

from __future__ import annotations

import json
import re
from pathlib import Path

from clustersim.sim.folder import output_folder
from clustersim.sim.results.breakdown import (
    EXPOSED_KINDS,
    alltoall_busbw_GBps,
    alltoall_sizes,
    message_departures,
    step_breakdown,
)
from clustersim.sim.results.table import time_unit
from clustersim.sim.run import RunResult

HOTTEST = 3
OUTPUT_FILES = ("compare.json", "compare.md", "compare.png")


def compare_row(result: RunResult) -> dict:
    """One scenario's compare.json object (keys in the README's order)."""
    s = result.summary
    b = step_breakdown(result.log, s["step_time_s"], message_departures(result.program, result.log))
    means = b.means()
    return {
        "name": result.scenario.name,
        "step_time_s": s["step_time_s"],
        "compute_s": means["compute_s"],
        "bubble_s": means["bubble_s"],
        "exposed_comm_s": means["exposed_comm_s"],
        "exposed_by_group_s": means["exposed_by_group_s"],
        "alltoall_time_s": float(b.in_kind_s["all_to_all"].mean()),
        "allreduce_time_s": float(b.in_kind_s["all_reduce"].mean()),
        "megatron_bubble_over_ideal_mean": s["megatron_bubble_over_ideal_mean"],
        "mfu": s["mfu"],
        "hottest_links": s["hottest_links"][:HOTTEST],
        "alltoall_busbw_GBps": alltoall_busbw_GBps(result.log, alltoall_sizes(result.program)),
        "memory_peak_bytes": max(peak["total"] for peak in s["memory_peak_bytes_per_rank"].values()),
        "memory_capacity_bytes": s["memory_capacity_bytes"],
        "fits": not s["memory_over_capacity_ranks"],
    }


def shown_kinds(rows: list[dict]) -> list[str]:
    """Communication kinds exposed in at least one scenario, in priority order."""
    return [k for k in EXPOSED_KINDS if any(r["exposed_comm_s"][k] > 0 for r in rows)]


def markdown(rows: list[dict]) -> str:
    """The compare table, then who is fastest and by what ratio."""
    unit, scale = time_unit(max(r["step_time_s"] for r in rows))
    kinds = shown_kinds(rows)
    head = [
        "scenario",
        f"step ({unit})",
        f"compute ({unit})",
        *(f"exposed {k} ({unit})" for k in kinds),
        f"bubble ({unit})",
        "MFU (%)",
        "all-to-all busbw (GB/s)",
        "peak memory (GiB)",
    ]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for r in rows:
        times = (r["step_time_s"], r["compute_s"], *(r["exposed_comm_s"][k] for k in kinds), r["bubble_s"])
        busbw = r["alltoall_busbw_GBps"]
        cells = [
            r["name"],
            *(f"{v * scale:.3f}".replace("-0.000", "0.000") for v in times),
            f"{100 * r['mfu']:.1f}",
            "-" if busbw is None else f"{busbw:.1f}",
            f"{r['memory_peak_bytes'] / 2**30:.1f}" + ("" if r["fits"] else " (does not fit)"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + group_table(rows, unit, scale) + faster_line(rows, unit, scale) + "\n"


def group_table(rows: list[dict], unit: str, scale: float) -> str:
    """The exposed communication again, by the parallelism it serves (sim.results.breakdown.GROUPS),
    for the groups exposed in at least one scenario; nothing when none is."""
    groups = [g for g in rows[0]["exposed_by_group_s"] if any(r["exposed_by_group_s"].get(g, 0.0) > 0 for r in rows)]
    if not groups:
        return ""
    head = ["scenario", *(f"exposed {g} ({unit})" for g in groups)]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * len(groups)]
    for r in rows:
        cells = (f"{r['exposed_by_group_s'].get(g, 0.0) * scale:.3f}" for g in groups)
        lines.append("| " + " | ".join([r["name"], *cells]) + " |")
    return "\n".join(lines) + "\n\n"


def faster_line(rows: list[dict], unit: str, scale: float) -> str:
    """'A is the fastest: 1.25x faster than B (8.000 ms vs 10.000 ms)'; ratio = slower step / faster
    step. Only scenarios that fit in their GPUs' memory are ranked; the others are named as such."""
    fitting = [r for r in rows if r["fits"]]
    left_out = [
        f"{r['name']} does not fit ({r['memory_peak_bytes'] / 2**30:.1f} GiB peak > "
        f"{r['memory_capacity_bytes'] / 2**30:.1f} GiB) and is not ranked"
        for r in rows
        if not r["fits"]
    ]
    if not fitting:
        return "No scenario fits in memory: " + "; ".join(left_out)
    fast = min(fitting, key=lambda r: r["step_time_s"])  # the first listed wins a tie
    parts = [
        f"{r['step_time_s'] / fast['step_time_s']:.2f}x faster than {r['name']} "
        f"({fast['step_time_s'] * scale:.3f} {unit} vs {r['step_time_s'] * scale:.3f} {unit})"
        if fast["step_time_s"] > 0
        else f"no slower than {r['name']}"
        for r in fitting
        if r is not fast
    ]
    line = f"**{fast['name']}** is the fastest" + (" of those that fit" if left_out else "")
    line += (": " + "; ".join(parts) if parts else "") + "."
    return line + ("" if not left_out else " " + "; ".join(left_out) + ".")


def default_dir(names: list[str]) -> Path:
    return Path("runs") / ("compare-" + "-vs-".join(re.sub(r"[^A-Za-z0-9_.-]+", "_", n) for n in names))


def write_compare(results: list[RunResult], out_dir: Path) -> tuple[Path, str]:
    """Write compare.json, compare.md and compare.png, all or nothing (sim.folder.output_folder);
    return the folder and the table."""
    rows = [compare_row(r) for r in results]
    table = markdown(rows)
    with output_folder(out_dir, kind="compare") as tmp:
        (tmp / "compare.json").write_text(json.dumps(rows, indent=2, allow_nan=False) + "\n")
        (tmp / "compare.md").write_text(table)
        from clustersim.sim.views.compare import plot_compare  # matplotlib only when drawing

        plot_compare(rows, tmp / "compare.png", shown_kinds(rows), HOTTEST)
    return Path(out_dir), table
