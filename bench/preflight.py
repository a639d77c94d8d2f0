"""The resource pre-check against the real thing: for each scenario, the estimated ops
(sim.preflight.estimate) against the program's real op count, and the estimated bytes against the
peak RSS of a child process that builds and runs it (`ru_maxrss`).

    python bench/preflight.py [SCENARIO.yaml ...]    # default: every bundled scenario up to 1,024 GPUs

Prints one row per scenario and the ratios; BYTES_PER_OP and BASE_BYTES in sim/preflight.py come
from this table (the largest measured bytes per op above the base, so the estimate errs high).
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
from pathlib import Path

from clustersim.sim.preflight import estimate
from clustersim.sim.results.table import format_table
from clustersim.sim.scenario.loader import load_scenarios

ROOT = Path(__file__).resolve().parent.parent
MAX_GPUS = 1024


def _measure(path: str, index: int, out) -> None:
    """In a fresh child: build and run the scenario, send back (ops, peak RSS bytes)."""
    from clustersim.sim.build import program_of
    from clustersim.sim.run import simulate

    scenario = load_scenarios(path)[index]
    program = program_of(scenario)
    simulate(scenario, program=program)
    out.send((sum(len(ops) for ops in program.ops.values()), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", help="scenario files (default: the bundled ones)")
    args = parser.parse_args()
    paths = args.scenarios or [str(p) for p in sorted((ROOT / "scenarios").rglob("*.yaml"))]
    rows = []
    context = multiprocessing.get_context("spawn")
    for path in paths:
        for index, scenario in enumerate(load_scenarios(path)):
            if scenario.num_gpus > MAX_GPUS and not args.scenarios:
                continue
            est = estimate(scenario)
            receive, send = context.Pipe(duplex=False)
            child = context.Process(target=_measure, args=(path, index, send))
            child.start()
            ops, rss = receive.recv()
            child.join()
            rows.append(
                {
                    "scenario": scenario.name,
                    "ops": ops,
                    "estimated ops": est.ops,
                    "ops ratio": est.ops / ops,
                    "peak RSS (GB)": rss / 1e9,
                    "estimated (GB)": est.bytes / 1e9,
                    "bytes ratio": est.bytes / rss,
                }
            )
            print(rows[-1], file=sys.stderr)
    print(
        format_table(
            rows,
            [(k, k, ".3f" if isinstance(v, float) else "d" if isinstance(v, int) else "") for k, v in rows[0].items()],
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
