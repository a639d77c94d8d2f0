"""clustersim against published training runs: the first table of docs/calibration.md, simulated.

Every row is a real training run from a paper, with its source: a scenario in
scenarios/calibration/, compared on the step time. One efficiency per GPU type (the GPU table's,
sim/hardware.py), never a per-row setting. The collectives section's rows (nccl-tests bus
bandwidths) are bench/nccl_tests.py's.

    python bench/calibration.py            # every row (the 64-GPU ones take minutes)
    python bench/calibration.py --small    # only the rows tests/test_calibration.py reruns
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path

from clustersim.sim.run import simulate
from clustersim.sim.scenario.hardware import GPUS
from clustersim.sim.scenario.loader import load_scenario

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Row:
    source: str
    configuration: str
    published: float
    unit: str  # "s" (step time)
    scenario: str  # scenarios/calibration/<scenario>.yaml
    small: bool = False  # cheap enough for the test suite


ROWS = [
    Row(
        "Korthikanti et al. 2022 (arXiv:2205.05198) Table 5",
        "22B, 8 A100, TP 8 + SP, selective recompute, batch 4",
        1.10,
        "s",
        scenario="k22b_selective",
        small=True,
    ),
    Row(
        "Korthikanti et al. 2022 Table 5, Full Recompute",
        "22B, 8 A100, TP 8, full recompute, batch 4",
        1.42,
        "s",
        scenario="k22b_full",
        small=True,
    ),
    Row(
        "Korthikanti et al. 2022 Table 5",
        "175B, 64 A100, TP 8 + SP, PP 8 x 3 chunks, selective, batch 64",
        13.75,
        "s",
        scenario="k175b_selective",
    ),
    Row(
        "Korthikanti et al. 2022 Table 5, Full Recompute",
        "175B, 64 A100, TP 8, PP 8 x 3 chunks, full, batch 64",
        18.13,
        "s",
        scenario="k175b_full",
    ),
]


def simulated(row: Row) -> float:
    """The row's figure from clustersim: the step's seconds."""
    scenario = load_scenario(ROOT / "scenarios" / "calibration" / f"{row.scenario}.yaml")
    return simulate(scenario).summary["step_time_s"]


def error(row: Row, value: float) -> float:
    """Relative error of the simulated figure, (simulated - published) / published."""
    return (value - row.published) / row.published


def table(rows: list[Row], values: list[float]) -> str:
    lines = ["| source | configuration | published | simulated | error |", "| --- | --- | ---: | ---: | ---: |"]
    for row, value in zip(rows, values):
        lines.append(
            f"| {row.source} | {row.configuration} | {row.published:.2f} {row.unit} | "
            f"{value:.2f} {row.unit} | {error(row, value):+.1%} |"
        )
    median = statistics.median(abs(error(row, value)) for row, value in zip(rows, values))
    lines.append(
        f"\nMedian absolute error over {len(rows)} rows: {median:.1%}. "
        f"A100 efficiency {GPUS['A100-SXM-80GB'].efficiency} of peak for every row."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="only the rows the test suite reruns")
    rows = [row for row in ROWS if row.small or not parser.parse_args().small]
    print(table(rows, [simulated(row) for row in rows]))


if __name__ == "__main__":
    main()
