"""Production scale: wall time, peak memory and op rate of a 1,024- and a 4,096-GPU GPT-3 step and
a 16,384-GPU Llama-3-405B-like one.

Each run is `simulate` on scenarios/gpt3_175b_1024.yaml (128 nodes, TP 8, PP 16 x 3 chunks, DP 8,
192 microbatches), then the same with 512 nodes and DP 32 (global batch 6144, still 192
microbatches per pipeline), then scenarios/llama3_405b_16k.yaml (2,048 nodes, TP 8, PP 16 x 2,
DP 128), each in a child process of its own so its peak RSS is its own. The
engine walks one rank per orbit (sim.symmetry): "walked" ops are the representatives' ops, and
"stood for" counts every rank's. The op rate is set against a bare SimPy loop (one process, one
timeout per event) timed here in the same run, as bench/engine.py does.

    python bench/scale.py [--only 1024|4096|16384]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from engine import bare_simpy_seconds  # bench/engine.py, beside this file

ROOT = Path(__file__).resolve().parent.parent
GPT3 = ROOT / "scenarios" / "gpt3_175b_1024.yaml"
SIZES = {
    "1024": (GPT3, {}),
    "4096": (GPT3, {"nodes": 512, "dp": 32, "global_batch": 6144}),
    "16384": (ROOT / "scenarios" / "llama3_405b_16k.yaml", {}),
}


def child(size: str) -> None:
    """Run one size and print its figures as one JSON line (this process's own peak RSS)."""
    sys.path.insert(0, str(ROOT))
    from clustersim.sim.run import simulate
    from clustersim.sim.scenario.loader import load_scenario

    start = time.perf_counter()
    path, change = SIZES[size]
    scenario = load_scenario(path)
    if change:
        scenario = scenario.model_copy(
            update={
                "cluster": scenario.cluster.model_copy(update={"nodes": change["nodes"]}),
                "parallel": scenario.parallel.model_copy(update={"dp": change["dp"]}),
                "training": scenario.training.model_copy(update={"global_batch": change["global_batch"]}),
            }
        )
    result = simulate(scenario)
    wall = time.perf_counter() - start
    walked = sum(len(ops) for ops in result.program.ops.values())
    images = (result.summary["symmetry"] or {}).get("images_per_rank", 1)
    print(
        json.dumps(
            {
                "gpus": scenario.num_gpus,
                "wall_s": wall,
                "walked_ops": walked,
                "stood_for_ops": walked * images,
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "step_time_s": result.summary["step_time_s"],
                "mfu": result.summary["mfu"],
                "image_spread_s": (result.summary["symmetry"] or {}).get("image_spread_s"),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(SIZES))
    parser.add_argument("--child", choices=sorted(SIZES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    bare_rate = 1e6 / min(bare_simpy_seconds(1_000_000) for _ in range(3))
    print(f"bare simpy: {bare_rate:,.0f} events/s (best of 3 loops of 1e6 timeouts)")
    print(
        f"{'GPUs':>6} {'wall s':>8} {'peak RSS GiB':>13} {'walked ops':>11} {'stood for':>11} {'walked ops/s':>13} "
        f"{'ratio':>6} {'step s':>8} {'MFU':>6}"
    )
    for size in [args.only] if args.only else list(SIZES):
        out = subprocess.run([sys.executable, __file__, "--child", size], check=True, capture_output=True, text=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rate = r["walked_ops"] / r["wall_s"]
        print(
            f"{r['gpus']:>6} {r['wall_s']:>8.1f} {r['peak_rss_bytes'] / 2**30:>13.2f} {r['walked_ops']:>11,} "
            f"{r['stood_for_ops']:>11,} {rate:>13,.0f} {rate / bare_rate:>6.3f} {r['step_time_s']:>8.3f} "
            f"{r['mfu']:>6.3f}"
        )


if __name__ == "__main__":
    main()
