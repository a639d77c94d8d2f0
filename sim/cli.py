"""The `clustersim` command: run or compare scenarios, print the scenario schema, show a schedule
(the fabric commands, collective and topology, are sim/cli_fabric.py's; plan and sweep are
sim/cli_plan.py's)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from clustersim.schedules.grid import compute_grid, compute_order_json
from clustersim.schedules.pipeline import SCHEDULES, ScheduleError, build_program, placement, rank_order
from clustersim.schedules.validate import ProgramError
from clustersim.sim.cli_fabric import add_key_flags, collective_command, topology_command
from clustersim.sim.cli_plan import add_plan_commands
from clustersim.sim.folder import OutputError, Terminated, check_target, locked, terminated, version
from clustersim.sim.scenario.json_schema import scenario_json_schema
from clustersim.sim.scenario.loader import load_scenario, load_scenarios
from clustersim.sim.scenario.schema import ScenarioError


def _run(args: argparse.Namespace) -> int:
    from clustersim.sim.build import program_of
    from clustersim.sim.progress import op_progress
    from clustersim.sim.report import PLOTS, output_files, terminal_summary, write_outputs
    from clustersim.sim.results.csv_tables import csv_text, rank_rows
    from clustersim.sim.results.memory import capacity_message
    from clustersim.sim.run import simulate

    try:
        skipped = (PLOTS if args.no_plots else ()) + (("trace.json",) if args.no_trace else ())
        files = output_files(args.outputs, skipped + (("program.txt",) if args.no_program else ()))
    except ValueError as exc:
        raise ScenarioError("(command line)", "--outputs", str(exc)) from None
    scenario = load_scenario(args.scenario)
    out = check_target(Path(args.output) if args.output else scenario.output_dir)  # before any simulation
    check_resources(args.scenario, scenario, args.max_memory)
    with locked(out):
        program = program_of(scenario)
        with op_progress(sum(len(ops) for ops in program.ops.values()), scenario.name) as on_progress:
            result = simulate(scenario, on_progress, program)
        over = capacity_message(result.summary["memory_peak_bytes_per_rank"], result.summary["memory_capacity_bytes"])
        if over and args.strict_memory:
            raise ScenarioError(args.scenario, "cluster.gpu", f"{over} (--strict-memory)")
        out_dir = write_outputs(result, out, files)
    p = scenario.parallel
    notes = sys.stderr if args.format == "csv" else sys.stdout  # csv: stdout holds only the table
    print(
        f"{scenario.name}: {scenario.schedule}, pp={p.pp} x virtual={p.virtual}, dp={p.dp}, ZeRO {p.zero}, "
        f"{scenario.num_microbatches} microbatches on {scenario.num_gpus} x {scenario.gpu_spec.name}",
        file=notes,
    )
    print(csv_text(rank_rows(result.summary)) if args.format == "csv" else terminal_summary(result) + "\n", end="")
    print(f"\nwrote {out_dir}/: {' '.join(files)}", file=notes)
    return 0


def check_resources(source: str, scenario, max_memory: str | None) -> None:
    """Refuse (ScenarioError, exit 2) a run whose estimated memory exceeds --max-memory (default:
    sim.preflight's share of the memory free now), before anything big is built."""
    from clustersim.sim.preflight import default_limit_bytes, refusal
    from clustersim.sim.scenario.units import parse_bytes

    try:
        limit = parse_bytes(max_memory) if max_memory is not None else default_limit_bytes()
    except ValueError as exc:
        raise ScenarioError("(command line)", "--max-memory", str(exc)) from None
    if why := refusal(scenario, limit):
        raise ScenarioError(source, "(resources)", why)


def _compare(args: argparse.Namespace) -> int:
    from clustersim.sim.build import program_of
    from clustersim.sim.compare import OUTPUT_FILES, default_dir, write_compare
    from clustersim.sim.progress import op_progress
    from clustersim.sim.run import simulate

    scenarios = [s for path in args.scenarios for s in load_scenarios(path)]  # every file checked before any run
    if len(scenarios) < 2:
        raise ScenarioError(
            "(command line)",
            "SCENARIO",
            f"compare needs at least two scenarios (files, or a file's variants), got {len(scenarios)}",
        )
    out = check_target(Path(args.output) if args.output else default_dir([s.name for s in scenarios]))
    for scenario in scenarios:
        check_resources(scenario.name, scenario, args.max_memory)
    with locked(out):
        programs = [program_of(scenario) for scenario in scenarios]
        results = []
        for scenario, program in zip(scenarios, programs):
            with op_progress(sum(len(ops) for ops in program.ops.values()), scenario.name) as on_progress:
                results.append(simulate(scenario, on_progress, program))
        out_dir, table = write_compare(results, out)
    print(table, end="")
    print(f"\nwrote {out_dir}/: {' '.join(OUTPUT_FILES)}")
    return 0


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(scenario_json_schema(), indent=2))
    return 0


def _schedule(args: argparse.Namespace) -> int:
    for name in ("pp", "microbatches", "virtual"):
        if getattr(args, name) < 1:
            raise ScenarioError("(command line)", f"--{name}", f"must be >= 1, got {getattr(args, name)}")
    try:
        order = rank_order(args.kind, args.pp, args.microbatches, args.virtual)
    except ScheduleError as exc:  # virtual > 1 on a one-stage-per-rank schedule, or m not a multiple of pp
        raise ScenarioError("(command line)", f"--{exc.knob}", str(exc)) from None
    program = build_program(
        order,
        args.microbatches,
        placement(args.kind, args.pp, args.virtual),
        0.0,
        forward_flops=lambda s: 0.0,
        backward_flops=lambda s: 0.0,
        weight_flops=lambda s: 0.0,
    )
    print(json.dumps(compute_order_json(program), allow_nan=False) if args.json else compute_grid(program))
    return 0


MAX_MEMORY_HELP = (
    "refuse (exit 2, before building) a run estimated to need more memory than SIZE, e.g. 64GB "
    "(default: 80%% of the memory free when it starts)"
)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="clustersim", description="Simulate LLM training on a GPU cluster.")
    top.add_argument("--version", action="version", version=f"clustersim {version()}")
    sub = top.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="simulate one training step of a scenario and write its outputs")
    run.add_argument("scenario", help="scenario YAML file")
    run.add_argument(
        "-o",
        "--output",
        help="output folder (default: the scenario's output.dir or runs/<name>); a new folder or a previous run's",
    )
    run.add_argument(
        "--strict-memory",
        action="store_true",
        help="fail (exit 2, nothing written) when a rank's peak memory exceeds the GPU's",
    )
    run.add_argument(
        "--outputs",
        metavar="FILES",
        help="comma-separated files to write, or plots / tables / all (default all: summary.json, ranks.csv, "
        "links.csv, gantt.png, trace.json, links.png, memory.png, traffic.png, program.txt); summary.json is "
        "always written, so --outputs summary.json writes the least (for sweeps)",
    )
    run.add_argument(
        "--format",
        choices=("text", "csv"),
        default="text",
        help="terminal output: the summary and per-rank table (text), or the per-rank table as CSV on stdout (csv)",
    )
    run.add_argument("--max-memory", metavar="SIZE", help=MAX_MEMORY_HELP)
    run.add_argument("--no-plots", action="store_true", help="skip the PNGs (and never import matplotlib)")
    run.add_argument("--no-trace", action="store_true", help="skip trace.json (Perfetto), large on big runs")
    run.add_argument("--no-program", action="store_true", help="skip program.txt (every rank's op list)")
    run.set_defaults(func=_run)
    comp = sub.add_parser("compare", help="run several scenarios and compare where their step time goes")
    comp.add_argument(
        "scenarios", nargs="+", metavar="SCENARIO", help="two or more scenario YAML files, or files with variants"
    )
    comp.add_argument("-o", "--output", help="output folder (default: runs/compare-<name1>-vs-<name2>...)")
    comp.add_argument("--max-memory", metavar="SIZE", help=MAX_MEMORY_HELP)
    comp.set_defaults(func=_compare)
    add_plan_commands(sub)
    schema = sub.add_parser("schema", help="print the scenario format as JSON Schema")
    schema.set_defaults(func=_schema)
    sched = sub.add_parser("schedule", help="print each rank's compute order for a pipeline schedule")
    sched.add_argument("--kind", choices=sorted(SCHEDULES), required=True)
    sched.add_argument("--pp", type=int, required=True, help="pipeline ranks")
    sched.add_argument("--microbatches", type=int, required=True)
    sched.add_argument(
        "--virtual",
        type=int,
        default=1,
        help="model chunks per rank (default 1): chunk c of rank r is stage c x pp + r (zbv, dualpipev: 2, "
        "rank r holds stages r and 2 pp - 1 - r)",
    )
    sched.add_argument("--json", action="store_true", help="JSON instead of a text grid")
    sched.set_defaults(func=_schedule)
    coll = sub.add_parser("collective", help="time a collective over a size sweep, as an nccl-tests-style table")
    coll.add_argument(
        "op",
        metavar="OP",
        help="all_reduce | reduce_scatter | all_gather | broadcast | reduce | gather | scatter | all_to_all | p2p",
    )
    coll.add_argument(
        "--topology",
        required=True,
        help="a spec: ring:8, switch:16, torus:4x4x4, fattree:nodes=8,gpus_per_node=8, ring:8,link_bandwidth=25GB/s",
    )
    coll.add_argument("--sizes", required=True, help="MIN:MAX[:FACTOR] doubling by default (1KiB:1GiB), or one size")
    coll.add_argument("--algo", default="auto", help="algorithm (default auto; a wrong name lists the valid ones)")
    coll.add_argument("--type", default="float", help="element type for the count column (default float)")
    coll.add_argument("--redop", default="sum", help="sum | prod | max | min (reducing collectives)")
    coll.add_argument("--root", type=int, default=0, help="root GPU of broadcast, reduce, gather, scatter")
    coll.add_argument("--json", action="store_true", help="the rows as a JSON list instead of a table")
    coll.add_argument("--csv", action="store_true", help="the rows as CSV instead of a table")
    coll.add_argument(
        "--nccl",
        default="auto",
        help="the NCCL layer: auto (on where GPUs sit on an NVSwitch at an A100's or H100's NVLink rate: "
        "dgx, fattree), off (textbook algorithms), or the system A100 | H100",
    )
    coll.add_argument("--protocol", default="auto", help="NCCL protocol: auto (NCCL's choice) | LL | LL128 | Simple")
    coll.add_argument("--no-tree", dest="tree", action="store_false", help="NCCL may not pick its tree all-reduce")
    coll.add_argument("--no-nvls", dest="nvls", action="store_false", help="NCCL may not use NVLink SHARP")
    coll.add_argument("--no-pxn", dest="pxn", action="store_false", help="inter-node messages use the sender's NIC")
    coll.add_argument("--copy-engine", action="store_true", help="intra-node copies by the copy engine (line rate)")
    coll.add_argument("--nccl-version", default=None, help="the NCCL release to time (2.8.4 up; default the latest)")
    coll.add_argument("--plot", metavar="PNG", help="also draw busbw vs size for each algorithm of the collective")
    add_key_flags(coll)
    coll.set_defaults(func=collective_command)
    topo = sub.add_parser("topology", help="draw a scenario's network graph to a PNG and print its size")
    topo.add_argument("scenario", metavar="SCENARIO", help="scenario YAML file, or a topology spec such as torus:4x4x4")
    topo.add_argument("-o", "--output", help="PNG path (default: runs/<name>/topology.png)")
    add_key_flags(topo)
    topo.set_defaults(func=topology_command)
    return top


def main(argv: list[str] | None = None) -> int:
    """Entry point. Bad input prints one line to stderr and exits 2, never a traceback."""
    if argv is None:  # the console script: `clustersim ... | head` ends quietly
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    args = parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        return args.func(args)
    except (ScenarioError, ProgramError, OutputError) as exc:
        print(f"clustersim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # every folder being written was removed on the way out
        print("clustersim: interrupted (SIGINT); nothing was written", file=sys.stderr)
        return 130
    except Terminated:
        print("clustersim: terminated (SIGTERM); nothing was written", file=sys.stderr)
        return 143
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
