"""The `clustersim` command: run a scenario, print the scenario schema, show a schedule."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from schedules.grid import compute_grid, compute_order_json
from schedules.pipeline import SCHEDULES, build_program, stage_order
from schedules.validate import ProgramError
from sim.scenario import ScenarioError, scenario_json_schema
from sim.scenario_loader import load_scenario


def _run(args: argparse.Namespace) -> int:
    from sim.report import OUTPUT_FILES, terminal_summary, write_outputs
    from sim.run import simulate

    scenario = load_scenario(args.scenario)
    result = simulate(scenario)
    out_dir = write_outputs(result, Path(args.output) if args.output else scenario.output_dir)
    print(f"{scenario.name}: {scenario.schedule}, pp={scenario.parallel.pp}, "
          f"{scenario.num_microbatches} microbatches on {scenario.num_gpus} x {scenario.gpu_spec.name}")
    print(terminal_summary(result))
    print(f"\nwrote {out_dir}/: {' '.join(OUTPUT_FILES)}")
    return 0


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(scenario_json_schema(), indent=2))
    return 0


def _schedule(args: argparse.Namespace) -> int:
    for name in ("pp", "microbatches"):
        if getattr(args, name) < 1:
            raise ScenarioError("(command line)", f"--{name}", f"must be >= 1, got {getattr(args, name)}")
    order = stage_order(args.kind, args.pp, args.microbatches)
    program = build_program(order, args.microbatches, {s: s for s in range(args.pp)}, 0.0,
                            forward_flops=lambda s: 0.0, backward_flops=lambda s: 0.0)
    print(json.dumps(compute_order_json(program)) if args.json else compute_grid(program))
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="clustersim", description="Simulate LLM training on a GPU cluster.")
    sub = top.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="simulate one training step of a scenario and write its outputs")
    run.add_argument("scenario", help="scenario YAML file")
    run.add_argument("-o", "--output", help="output folder (default: the scenario's output.dir or runs/<name>)")
    run.set_defaults(func=_run)
    schema = sub.add_parser("schema", help="print the scenario format as JSON Schema")
    schema.set_defaults(func=_schema)
    sched = sub.add_parser("schedule", help="print each rank's compute order for a pipeline schedule")
    sched.add_argument("--kind", choices=sorted(SCHEDULES), required=True)
    sched.add_argument("--pp", type=int, required=True, help="pipeline stages (one per rank)")
    sched.add_argument("--microbatches", type=int, required=True)
    sched.add_argument("--json", action="store_true", help="JSON instead of a text grid")
    sched.set_defaults(func=_schedule)
    return top


def main(argv: list[str] | None = None) -> int:
    """Entry point. Bad input prints one line to stderr and exits 2, never a traceback."""
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (ScenarioError, ProgramError) as exc:
        print(f"clustersim: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
