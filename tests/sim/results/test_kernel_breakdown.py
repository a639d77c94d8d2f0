"""With cluster.compute_model: kernel, summary.json, the terminal and ranks.csv split the compute
time by kernel class, and the classes add up to the compute the breakdown measured from the spans."""

import pytest

from clustersim.sim.cost.kernel import KERNEL_CLASSES
from clustersim.sim.report import breakdown_line
from clustersim.sim.results.csv_tables import rank_rows
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario_text

SCENARIO = """
name: kb
cluster: {gpu: H100-SXM, nodes: 1, gpus_per_node: 8, compute_model: kernel,
          topology: {kind: switch, link_bandwidth: 450GB/s, link_latency: 1us}}
model: {preset: gpt3-1.3b}
training: {global_batch: 16, micro_batch: 2, recompute: selective}
parallel: {pp: 2, tp: 2, dp: 2, sequence_parallel: true}
schedule: zb-h1
numerics: {enabled: false}
"""


@pytest.fixture(scope="module")
def summary() -> dict:
    return simulate(load_scenario_text(SCENARIO, "kb.yaml")).summary


def test_kernel_classes_add_up_to_the_measured_compute(summary):
    b = summary["time_breakdown_s"]
    assert list(b["compute_by_kernel_class"]) == list(KERNEL_CLASSES)
    assert sum(b["compute_by_kernel_class"].values()) == pytest.approx(b["compute"], rel=1e-9)
    assert all(v > 0 for v in b["compute_by_kernel_class"].values())


def test_terminal_and_csv_show_the_classes(summary):
    assert "compute kernels  gemm " in breakdown_line(summary)
    rows = rank_rows(summary)
    per_rank = summary["compute_by_kernel_class_s_per_rank"]
    assert [row["compute_gemm_s"] for row in rows] == [r["gemm"] for r in per_rank]
