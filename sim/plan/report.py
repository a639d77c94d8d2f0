"""What a plan or sweep writes: one row per candidate (its overrides and what its simulation
measured: step time, MFU, memory peak, bubble, exposed communication), as a CSV and a text
table, the Pareto plot (sim.views.pareto), and for a plan the best candidate as a scenario file
that loads and runs as it is."""

from __future__ import annotations

from pathlib import Path

import yaml

from clustersim.sim.results.csv_tables import csv_text
from clustersim.sim.results.table import format_table

GiB = 2**30
SHORT = {
    "parallel.tp": "tp",
    "parallel.pp": "pp",
    "parallel.dp": "dp",
    "parallel.ep": "ep",
    "parallel.virtual": "v",
    "training.micro_batch": "mb",
    "schedule": "schedule",
    "parallel.zero": "zero",
    "training.recompute": "recompute",
    "parallel.sequence_parallel": "sp",
}


def label(overrides: dict) -> str:
    """A candidate in a few words: 'tp8 pp16 v3 dp8 mb1 interleaved zero1 selective sp'."""
    parts = []
    for path, value in overrides.items():
        name = SHORT.get(path, path)
        if isinstance(value, bool):
            parts.append(name if value else f"no-{name}")
        elif name in ("schedule", "recompute"):
            parts.append(f"{value}" if name == "schedule" else f"recompute-{value}")
        else:
            parts.append(f"{name}{value}")
    return " ".join(parts)


def result_row(key: str, overrides: dict, simulated: dict, estimated_s: float | None = None) -> dict:
    """One CSV row: the candidate's key and overrides, its estimate (plan) and its simulation."""
    row: dict = {"key": key, "label": label(overrides)}
    row |= {SHORT.get(path, path): value for path, value in overrides.items()}
    if estimated_s is not None:
        row["estimated_step_time_s"] = estimated_s
    if "error" in simulated:
        return row | {"error": simulated["error"]}
    exposed = simulated["exposed_comm_s"]
    row |= {
        "step_time_s": simulated["step_time_s"],
        "mfu": simulated["mfu"],
        "memory_peak_bytes": simulated["memory_peak_bytes"],
        "memory_capacity_bytes": simulated["memory_capacity_bytes"],
        "fits": simulated["fits"],
        "bubble_fraction": simulated["bubble_s"] / simulated["step_time_s"],  # summary.json's bubble
        "compute_s": simulated["compute_s"],
        "bubble_s": simulated["bubble_s"],
        "exposed_comm_s": sum(exposed.values()),
    }
    row |= {f"exposed_{kind}_s": seconds for kind, seconds in exposed.items()}
    row["simulation_wall_s"] = simulated.get("simulation_wall_s")
    row["memory_peak_bytes_per_rank"] = " ".join(f"{b:.0f}" for b in simulated["memory_peak_bytes_per_rank"])
    return row | {"error": ""}


def best_row(rows: list[dict]) -> dict | None:
    """The fastest simulated row that fits in memory (the first listed wins a tie)."""
    fitting = [r for r in rows if not r["error"] and r["fits"]]
    return min(fitting, key=lambda r: r["step_time_s"]) if fitting else None


def table(rows: list[dict]) -> str:
    """The terminal's table, fastest first, memory in GiB."""
    shown = sorted((r for r in rows if not r["error"]), key=lambda r: r["step_time_s"])
    for r in shown:
        r["memory_GiB"] = r["memory_peak_bytes"] / GiB
        r["fits_text"] = "yes" if r["fits"] else "NO"
        r["mfu_pct"] = 100 * r["mfu"]
    columns = [
        ("label", "candidate", "s"),
        ("step_time_s", "step (s)", ".3f"),
        ("mfu_pct", "MFU (%)", ".1f"),
        ("memory_GiB", "peak mem (GiB)", ".1f"),
        ("fits_text", "fits", "s"),
        ("bubble_fraction", "bubble", ".3f"),
        ("exposed_comm_s", "exposed comm (s)", ".3f"),
    ]
    if any("estimated_step_time_s" in r for r in shown):
        columns.insert(2, ("estimated_step_time_s", "estimate (s)", ".3f"))
    text = format_table(shown, columns)
    for r in shown:
        del r["memory_GiB"], r["fits_text"], r["mfu_pct"]
    failed = [r for r in rows if r["error"]]
    return text + "".join(f"\n{r['label']}: failed: {r['error']}" for r in failed)


def write_rows(folder: Path, stem: str, rows: list[dict], title: str, best: dict | None) -> list[str]:
    """STEM.csv, STEM.txt (the table) and pareto.png (when a row ran); the files' names."""
    columns = list(dict.fromkeys(key for row in rows for key in row))  # a refused row has fewer
    (folder / f"{stem}.csv").write_text(csv_text([dict.fromkeys(columns, "") | row for row in rows]))
    (folder / f"{stem}.txt").write_text(table(rows) + "\n")
    written = [f"{stem}.csv", f"{stem}.txt"]
    ran = [r for r in rows if not r["error"]]
    if ran:
        from clustersim.sim.views.pareto import plot_pareto  # matplotlib only when drawing

        plot_pareto(ran, folder / "pareto.png", title, best)
        written.append("pareto.png")
    return written


def best_scenario_text(data: dict, source: str, best: dict) -> str:
    """The best candidate's scenario as YAML, with a comment saying where it came from."""
    data = {k: v for k, v in data.items() if k != "output"}  # runs/<name> by default, not the plan's folder
    data["name"] = f"{data.get('name', 'scenario')}-plan"
    head = (
        f"# The fastest strategy `clustersim plan {source}` simulated that fits in memory:\n"
        f"# {best['label']}\n"
        f"# step {best['step_time_s']:.4f} s, MFU {100 * best['mfu']:.1f}%, "
        f"peak memory {best['memory_peak_bytes'] / GiB:.1f} GiB of {best['memory_capacity_bytes'] / GiB:.1f} GiB.\n"
    )
    return head + yaml.safe_dump(data, sort_keys=False)
