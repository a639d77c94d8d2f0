"""Issue 14's run-time bound: every Megatron SC21 Table 1 row (bench/fidelity.py's scenarios, 32 to
3,072 GPUs) in at most 2 minutes on the development machine. Each row runs in a child process of
its own, one at a time (bench/fidelity.run_row: its peak RSS is its own, and one big run at a time
holds the shared memory), after the --max-memory check `clustersim run` makes. The machine's speed
right now is a bare SimPy loop (bench/engine.py's, 1e6 timeouts) timed in the same run: "ratio" is
a row's wall time in units of that loop, comparable across sessions and loads where seconds are not;
CPU seconds (the child's user + system time) are what the shared machine's load changes least.

    python bench/table1_times.py [--only megatron_1t] [--max-memory 12GB]
"""

from __future__ import annotations

import argparse
import sys

from engine import bare_simpy_seconds  # bench/engine.py, beside this file
from fidelity import ROWS, run_row

BOUND_S = 120.0  # issue 14, acceptance 4
TABLE1 = {row.scenario: row for row in ROWS if row.unit == "TFLOP/s"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(TABLE1))
    parser.add_argument("--max-memory", default="12GB", help="refuse a row estimated above SIZE (default 12GB)")
    args = parser.parse_args()
    baseline_s = min(bare_simpy_seconds(1_000_000) for _ in range(3))
    print(f"baseline: a bare SimPy loop of 1e6 timeouts, {baseline_s:.2f} s (best of 3)")
    print(f"{'row':<15} {'wall s':>7} {'CPU s':>7} {'ratio':>6} {'peak RSS GiB':>13} {'step s':>8}  <= 2 min")
    over = 0
    for name in [args.only] if args.only else list(TABLE1):
        r = run_row(TABLE1[name], args.max_memory)
        if "error" in r:
            print(f"{name:<15} not run: {r['error']}")
            over += 1
            continue
        within = r["wall_s"] <= BOUND_S
        over += not within
        print(
            f"{name:<15} {r['wall_s']:>7.1f} {r['cpu_s']:>7.1f} {r['wall_s'] / baseline_s:>6.0f} "
            f"{r['peak_rss_bytes'] / 2**30:>13.2f} {r['step_time_s']:>8.3f}  {'yes' if within else 'NO'}"
        )
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
