"""Issue 16's fat-tree case: a 1,536-GPU Megatron 145.6B step (Narayanan et al. 2021, Table 1:
80 layers, h 12288, 96 heads; TP 8, PP 8, DP 24; 192 DGX A100 nodes) on a fat tree with Selene's
20-node leaf units (leaf_radix 20: the 8-node replicas straddle leaf boundaries, so no shift of
replicas maps the tree onto itself; one replica of each class lying alike is walked, two here)
against leaf_radix 16 (whole replicas per leaf pair: replica shifts, one replica walked) as the
baseline, timed in the same session. Each run is its own process
(`clustersim run --outputs summary.json`): wall clock, CPU seconds (the child's user + system time,
what the shared machine's load changes least) and peak RSS.

    python bench/leaf_radix.py      # each shape 3 times, interleaved; the ratio of the fastest
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPEATS = 3
SCENARIO = """\
name: megatron_145b_radix{radix}
cluster:
  gpu: A100-SXM-80GB
  nodes: 192
  gpus_per_node: 8
  topology: {{kind: fattree, nvlink_bandwidth: 300GB/s, nic_bandwidth: 25GB/s, leaf_radix: {radix},
             load_balance: adaptive, link_latency: 1us}}
model: {{layers: 80, hidden: 12288, heads: 96, ffn: 49152, seq_len: 2048, vocab: 51200}}
training: {{global_batch: 2304, micro_batch: 1, dtype: bf16, recompute: full}}
parallel: {{tp: 8, sequence_parallel: false, pp: 8, virtual: 5, dp: 24, order: [dp, pp, tp]}}
schedule: interleaved
numerics: {{enabled: false}}
"""


def run(radix: int, folder: Path) -> tuple[float, float, float, float]:
    """(wall seconds, CPU seconds, peak RSS GB, step time s) of one `clustersim run` of the scenario."""
    path = folder / f"radix{radix}.yaml"
    path.write_text(SCENARIO.format(radix=radix))
    out = folder / f"out{radix}_{len(list(folder.glob(f'out{radix}_*')))}"  # a fresh folder per run
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    command = [
        sys.executable,
        "-m",
        "clustersim.sim.cli",
        "run",
        str(path),
        "-o",
        str(out),
        "--outputs",
        "summary.json",
    ]
    subprocess.run(command, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    peak_kb = after.ru_maxrss  # the largest child so far
    step = json.loads((out / "summary.json").read_text())["step_time_s"]
    return wall, cpu, max(peak_kb, before.ru_maxrss) * 1024 / 1e9, step


def main() -> int:
    """Each shape REPEATS times, the two interleaved so both meet the same machine load; the
    fastest of each (the least disturbed) makes the ratio."""
    runs: dict[int, list[tuple[float, float, float, float]]] = {16: [], 20: []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(REPEATS):
            for radix in runs:
                runs[radix].append(run(radix, Path(tmp)))
    for radix, results in runs.items():
        walls = ", ".join(f"{wall:.1f}" for wall, *_ in results)
        cpus = ", ".join(f"{cpu:.1f}" for _, cpu, _, _ in results)
        _, _, rss, step = results[0]
        print(f"leaf_radix {radix}: wall {walls} s, CPU {cpus} s, peak RSS {rss:.2f} GB, step {step:.6f} s")
    for i, what in ((0, "wall"), (1, "CPU")):
        base, uneven = (min(r[i] for r in runs[radix]) for radix in runs)
        print(f"ratio of {what} time (radix 20 / radix 16, least of {REPEATS}): {uneven / base:.2f} (issue 16: <= 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
