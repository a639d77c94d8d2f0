"""clustersim against published measurements: the rows of docs/calibration.md, simulated.

Every row is a real training run or collective benchmark from a paper or vendor table, with its
source. Training rows are scenarios in scenarios/calibration/ and compare the step time;
collective rows time one collective on a fabric and compare nccl-tests' bus bandwidth. One
efficiency per GPU type (the GPU table's, sim/hardware.py), never a per-row setting.

    python bench/calibration.py            # every row (the 64-GPU ones take minutes)
    python bench/calibration.py --small    # only the rows tests/test_calibration.py reruns
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path

from clustersim.sim.collectives.run import time_collective
from clustersim.sim.run import simulate
from clustersim.sim.scenario.hardware import GPUS
from clustersim.sim.scenario.loader import load_scenario
from clustersim.sim.scenario.spec import parse_spec

ROOT = Path(__file__).resolve().parent.parent
GiB, MiB = 2**30, 2**20
DGX_A100 = "dgx:1,nvlink_bandwidth_Bps=300e9"
FOUR_DGX_A100 = "fattree:nodes=4,gpus_per_node=8,nvlink_bandwidth_Bps=300e9,nic_bandwidth_Bps=25e9"


@dataclass(frozen=True)
class Row:
    source: str
    configuration: str
    published: float
    unit: str  # "s" (step time) or "GB/s" (all-reduce bus bandwidth)
    scenario: str | None = None  # a training row: scenarios/calibration/<scenario>.yaml
    fabric: str | None = None  # a collective row: an all_reduce of `size` bytes over every GPU
    size: int = 0
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
    Row(
        "Azure/AI-benchmarking-guide, ND_A100_v4_results.md, NCCL bandwidth (NCCL 2.18.5)",
        "all_reduce 8 GiB, 8 A100 on NVSwitch",
        231.58,
        "GB/s",
        fabric=DGX_A100,
        size=8 * GiB,
        small=True,
    ),
    Row(
        "same table",
        "all_reduce 64 MiB, 8 A100 on NVSwitch",
        166.63,
        "GB/s",
        fabric=DGX_A100,
        size=64 * MiB,
        small=True,
    ),
    Row("same table", "all_reduce 1 MiB, 8 A100 on NVSwitch", 36.22, "GB/s", fabric=DGX_A100, size=1 * MiB, small=True),
    Row(
        "NVIDIA/nccl-tests#160 (S. Jeaugey, NVIDIA, 2023): a multi-node ring reaches ~24 GB/s per HDR NIC",
        "all_reduce 1 GiB, 4 DGX A100, 8 HDR NICs each: 8 x 24 GB/s",
        192.0,
        "GB/s",
        fabric=FOUR_DGX_A100,
        size=1 * GiB,
        small=True,
    ),
]


def simulated(row: Row) -> float:
    """The row's figure from clustersim: step seconds, or an all-reduce's bus bandwidth in GB/s."""
    if row.scenario is not None:
        scenario = load_scenario(ROOT / "scenarios" / "calibration" / f"{row.scenario}.yaml")
        return simulate(scenario).summary["step_time_s"]
    graph = parse_spec(row.fabric)
    seconds, _ = time_collective(graph, "all_reduce", "auto", None, row.size)
    n = sum(1 for _, data in graph.nodes(data=True) if data.get("kind") == "gpu")
    return 2 * (n - 1) / n * row.size / seconds / 1e9


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
