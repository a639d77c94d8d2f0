"""The `clustersim` command: run or compare scenarios, print the scenario schema, show a schedule."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from clustersim.schedules.grid import compute_grid, compute_order_json
from clustersim.schedules.pipeline import SCHEDULES, ScheduleError, build_program, rank_order, stage_ranks
from clustersim.schedules.validate import ProgramError
from clustersim.sim.scenario.loader import load_scenario, load_scenarios
from clustersim.sim.scenario.schema import ScenarioError, scenario_json_schema
from clustersim.sim.scenario.spec import key_flags


def _run(args: argparse.Namespace) -> int:
    from clustersim.sim.build import program_of
    from clustersim.sim.progress import op_progress
    from clustersim.sim.report import output_files, terminal_summary, write_outputs
    from clustersim.sim.results.memory import capacity_message
    from clustersim.sim.run import simulate

    scenario = load_scenario(args.scenario)
    program = program_of(scenario)
    with op_progress(sum(len(ops) for ops in program.ops.values()), scenario.name) as on_progress:
        result = simulate(scenario, on_progress, program)
    over = capacity_message(result.summary["memory_peak_bytes_per_rank"], result.summary["memory_capacity_bytes"])
    if over and args.strict_memory:
        raise ScenarioError(args.scenario, "cluster.gpu", f"{over} (--strict-memory)")
    written = {"plots": not args.no_plots, "trace": not args.no_trace, "program": not args.no_program}
    out_dir = write_outputs(result, Path(args.output) if args.output else scenario.output_dir, **written)
    p = scenario.parallel
    print(
        f"{scenario.name}: {scenario.schedule}, pp={p.pp} x virtual={p.virtual}, dp={p.dp}, ZeRO {p.zero}, "
        f"{scenario.num_microbatches} microbatches on {scenario.num_gpus} x {scenario.gpu_spec.name}"
    )
    print(terminal_summary(result))
    print(f"\nwrote {out_dir}/: {' '.join(output_files(**written))}")
    return 0


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
    programs = [program_of(scenario) for scenario in scenarios]
    results = []
    for scenario, program in zip(scenarios, programs):
        with op_progress(sum(len(ops) for ops in program.ops.values()), scenario.name) as on_progress:
            results.append(simulate(scenario, on_progress, program))
    out = Path(args.output) if args.output else default_dir([s.name for s in scenarios])
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
        stage_ranks(args.pp, args.virtual),
        0.0,
        forward_flops=lambda s: 0.0,
        backward_flops=lambda s: 0.0,
    )
    print(json.dumps(compute_order_json(program)) if args.json else compute_grid(program))
    return 0


def _collective(args: argparse.Namespace) -> int:
    from clustersim.sim.collectives import CollectiveError
    from clustersim.sim.collectives.nccl_table import TYPE_BYTES, parse_sizes, sweep, table
    from clustersim.sim.collectives.ops import OPS, REDUCE_OPS

    def bad(flag: str, reason) -> ScenarioError:
        return ScenarioError("(command line)", flag, str(reason))

    def parsed(flag: str, parse, text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise bad(flag, exc) from None

    if args.op not in OPS:
        raise bad("OP", f"unknown collective {args.op!r} (valid: {', '.join(OPS)})")
    for flag, value, valid in (("--type", args.type, TYPE_BYTES), ("--redop", args.redop, REDUCE_OPS)):
        if value not in valid:
            raise bad(flag, f"unknown {flag[2:]} {value!r} (valid: {', '.join(valid)})")
    sizes = parsed("--sizes", parse_sizes, args.sizes)
    graph = _spec_graph(args, args.topology, "--topology")
    num_gpus = sum(1 for _, kind in graph.nodes(data="kind") if kind == "gpu")
    if not 0 <= args.root < num_gpus:
        raise bad("--root", f"{args.root} is not a GPU of {args.topology} (0..{num_gpus - 1})")
    try:
        rows = sweep(graph, args.op, args.algo, sizes, args.type, args.redop, args.root)
    except CollectiveError as exc:
        raise bad("--algo", exc) from None
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"# {args.op} on {args.topology} ({num_gpus} GPUs), algorithm {args.algo}; GB = 1e9 bytes")
        print(table(rows))
    return 0


def _key_flags_given(args: argparse.Namespace) -> dict[str, object]:
    """The topology key flags given (--link_bandwidth 25GB/s ...), each value read as YAML reads it."""
    from clustersim.sim.scenario.loader import parse_yaml_value

    flags = {key: getattr(args, _dest(key)) for key in key_flags()}
    return {key: parse_yaml_value(value) for key, value in flags.items() if value is not None}


def _spec_graph(args: argparse.Namespace, spec: str, flag: str):
    """The graph of a spec with the key flags on top; a mistake names the flag it came from."""
    from clustersim.sim.scenario.spec import SpecError, parse_spec

    given = _key_flags_given(args)
    try:
        return parse_spec(spec, **given)
    except SpecError as exc:
        raise ScenarioError("(command line)", f"--{exc.key}" if exc.key in given else flag, str(exc)) from None


def _dest(key: str) -> str:
    return f"topology_key_{key}"


def _add_key_flags(command: argparse.ArgumentParser) -> None:
    """One flag per YAML key of any topology kind (`--link_bandwidth 25GB/s`, also spelt
    `--link-bandwidth`), setting that key of the spec; a key its kind does not take is an error."""
    group = command.add_argument_group(
        "topology keys", "the YAML keys of cluster.topology, set on the spec (the kinds taking each in brackets)"
    )
    for key, help_text in key_flags().items():
        spellings = dict.fromkeys((f"--{key}", f"--{key.replace('_', '-')}"))
        group.add_argument(*spellings, dest=_dest(key), metavar="VALUE", help=help_text)


def _topology(args: argparse.Namespace) -> int:
    import os
    import re
    import tempfile

    from clustersim.sim.build import build_topology
    from clustersim.sim.views.topology import draw_topology
    from clustersim.topologies.schema import NODE_KINDS, TOPOLOGY

    if Path(args.scenario).suffix in (".yaml", ".yml") or ":" not in args.scenario:
        if given := _key_flags_given(args):
            reason = "sets a key of a topology spec; a scenario file sets its keys in cluster.topology"
            raise ScenarioError("(command line)", f"--{next(iter(given))}", reason)
        scenario = load_scenario(args.scenario)
        graph, name, default = build_topology(scenario), scenario.name, scenario.output_dir / "topology.png"
    else:  # a topology spec such as torus:4x4x4
        graph = _spec_graph(args, args.scenario, "SCENARIO")
        name = args.scenario
        default = Path("runs") / "topology" / (re.sub(r"[^A-Za-z0-9_.-]+", "_", name) + ".png")
    kinds = {k: n for k in NODE_KINDS if (n := sum(1 for _, kind in graph.nodes(data="kind") if kind == k))}
    summary = (
        f"{graph.number_of_nodes()} nodes ({', '.join(f'{n} {k}' for k, n in kinds.items())}), "
        f"{graph.number_of_edges() // 2} links ({graph.number_of_edges()} directed edges)"
    )
    out = Path(args.output) if args.output else default
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".png", dir=out.parent)
    os.close(fd)
    try:  # all or nothing: a failed drawing leaves no half-written PNG
        kind = graph.graph.get(TOPOLOGY)
        draw_topology(graph, tmp, f"{name}: {kind + ', ' if kind else ''}{summary}")
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    print(f"{name}: {summary}")
    print(f"wrote {out}")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="clustersim", description="Simulate LLM training on a GPU cluster.")
    sub = top.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="simulate one training step of a scenario and write its outputs")
    run.add_argument("scenario", help="scenario YAML file")
    run.add_argument("-o", "--output", help="output folder (default: the scenario's output.dir or runs/<name>)")
    run.add_argument(
        "--strict-memory",
        action="store_true",
        help="fail (exit 2, nothing written) when a rank's peak memory exceeds the GPU's",
    )
    run.add_argument("--no-plots", action="store_true", help="skip the PNGs (and never import matplotlib)")
    run.add_argument("--no-trace", action="store_true", help="skip trace.json (Perfetto), large on big runs")
    run.add_argument("--no-program", action="store_true", help="skip program.txt (every rank's op list)")
    run.set_defaults(func=_run)
    comp = sub.add_parser("compare", help="run several scenarios and compare where their step time goes")
    comp.add_argument(
        "scenarios", nargs="+", metavar="SCENARIO", help="two or more scenario YAML files, or files with variants"
    )
    comp.add_argument("-o", "--output", help="output folder (default: runs/compare-<name1>-vs-<name2>...)")
    comp.set_defaults(func=_compare)
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
        help="model chunks per rank (interleaved; default 1): chunk c of rank r is stage c x pp + r",
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
    _add_key_flags(coll)
    coll.set_defaults(func=_collective)
    topo = sub.add_parser("topology", help="draw a scenario's network graph to a PNG and print its size")
    topo.add_argument("scenario", metavar="SCENARIO", help="scenario YAML file, or a topology spec such as torus:4x4x4")
    topo.add_argument("-o", "--output", help="PNG path (default: runs/<name>/topology.png)")
    _add_key_flags(topo)
    topo.set_defaults(func=_topology)
    return top


def main(argv: list[str] | None = None) -> int:
    """Entry point. Bad input prints one line to stderr and exits 2, never a traceback."""
    if argv is None:  # the console script: `clustersim ... | head` ends quietly
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (ScenarioError, ProgramError) as exc:
        print(f"clustersim: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
