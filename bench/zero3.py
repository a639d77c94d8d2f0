"""Issue 14's ZeRO-3 speed and memory case: Narayanan et al. 2021's 18.4B model (Table 1: 40
layers, h 6144, 48 heads) data-parallel over 384 A100s (48 DGX nodes, fat tree) with ZeRO 3,
every layer recomputed, against the same run with ZeRO 1 as the baseline, timed in the same
session (wall clock of `simulate`, build to summary). Tensor parallel 1: no symmetry to lean on,
every one of the 384 ranks is walked. Prints each run's wall time, step time and rank 0's peak
weights, and the ratio of the ZeRO-3 wall time to the baseline's.

    python bench/zero3.py [--unit-layers N]

On a tree from before ZeRO 3 gathered unit by unit (no --unit-layers there) it measures the old
whole-stage gathers the same way.
"""

from __future__ import annotations

import argparse
import sys
import time

from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario_text

SCENARIO = """\
name: megatron_18b_zero{zero}_dp384
cluster:
  gpu: A100-SXM-80GB
  nodes: 48
  gpus_per_node: 8
  topology: {{kind: fattree, nvlink_bandwidth: 300GB/s, nic_bandwidth: 25GB/s, leaf_radix: 16,
             load_balance: adaptive, link_latency: 1us}}
model: {{layers: 40, hidden: 6144, heads: 48, ffn: 24576, seq_len: 2048, vocab: 51200}}
training: {{global_batch: 384, micro_batch: 1, dtype: bf16, recompute: full}}
parallel: {{tp: 1, pp: 1, dp: 384, zero: {zero}{unit_layers}}}
schedule: 1f1b
numerics: {{enabled: false}}
"""


def run(zero: int, unit_layers: int | None) -> tuple[float, float, float]:
    """(wall seconds, step time s, rank 0's peak weights GB) of one simulated step."""
    key = "" if unit_layers is None else f", zero3_unit_layers: {unit_layers}"  # None: the default (or none)
    scenario = load_scenario_text(SCENARIO.format(zero=zero, unit_layers=key), f"zero{zero}.yaml")
    start = time.perf_counter()
    summary = simulate(scenario).summary
    wall = time.perf_counter() - start
    return wall, summary["step_time_s"], summary["memory_peak_bytes_per_rank"]["0"]["weights"] / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unit-layers", type=int, help="parallel.zero3_unit_layers (default: the scenario's, 1)")
    unit_layers = parser.parse_args().unit_layers
    base = run(1, unit_layers)
    zero3 = run(3, unit_layers)
    for zero, (wall, step, weights) in ((1, base), (3, zero3)):
        print(f"zero {zero}: {wall:.1f} s wall, step {step:.6f} s, rank 0 peak weights {weights:.3f} GB")
    print(
        f"ratio (zero 3 / zero 1 wall time): {zero3[0] / base[0]:.2f}  (zero3_unit_layers: {unit_layers or 'default'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
