"""The whole `clustersim run` of the 1,024-GPU GPT-3 scenario, every output written, against the
same run writing summary.json only, both timed here as a user would see them (wall clock of the
command, imports included).

The batch run (`--no-plots --no-trace --no-program`) is the baseline measured in the same session:
the difference is what the outputs cost (the plots are drawn in a forked child while the trace
and program are written, sim/report.py). The machine's speed drifts, so the bare SimPy rate of
bench/engine.py is printed alongside.

    python bench/run_outputs.py [--scenario PATH] [--repeat N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine import bare_simpy_seconds  # bench/engine.py, beside this file

ROOT = Path(__file__).resolve().parent.parent
BATCH = ("--no-plots", "--no-trace", "--no-program")


def wall_s(scenario: Path, flags: tuple[str, ...]) -> float:
    """Seconds one `clustersim run` takes, start of the interpreter to exit."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "clustersim.sim.cli", "run", str(scenario), "-o", str(Path(tmp) / "out"), *flags]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "gpt3_175b_1024.yaml")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each kind; the best is kept")
    args = parser.parse_args()
    bare_rate = 1e6 / min(bare_simpy_seconds(1_000_000) for _ in range(3))
    print(f"bare simpy: {bare_rate:,.0f} events/s (best of 3 loops of 1e6 timeouts)")
    batch = min(wall_s(args.scenario, BATCH) for _ in range(args.repeat))
    full = min(wall_s(args.scenario, ()) for _ in range(args.repeat))
    print(
        f"{args.scenario.name}: summary.json only {batch:.1f} s, every output {full:.1f} s "
        f"(ratio {full / batch:.2f}; the outputs cost {full - batch:.1f} s), best of {args.repeat}"
    )


if __name__ == "__main__":
    main()
