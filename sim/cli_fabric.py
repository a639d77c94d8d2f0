"""The fabric commands, `clustersim collective` and `clustersim topology`: a graph from a topology
spec (`torus:4x4x4`) or a scenario, with one flag per YAML key of the topology kinds (generated
from their pydantic models, so the flags are the keys)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from clustersim.sim.scenario.loader import load_scenario
from clustersim.sim.scenario.schema import ScenarioError
from clustersim.sim.scenario.spec import key_flags


def collective_command(args: argparse.Namespace) -> int:
    from clustersim.sim.collectives import CollectiveError
    from clustersim.sim.collectives.nccl_table import TYPE_BYTES, csv_text, parse_sizes, sweep, table
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
    if num_gpus < 2:  # nothing would move: a time of 0 and an infinite bandwidth
        raise bad("--topology", f"a collective needs at least 2 GPUs; {args.topology} has {num_gpus}")
    if not 0 <= args.root < num_gpus:
        raise bad("--root", f"{args.root} is not a GPU of {args.topology} (0..{num_gpus - 1})")
    layer = _nccl_layer(args, graph)
    try:
        rows = sweep(graph, args.op, args.algo, sizes, args.type, args.redop, args.root)
    except CollectiveError as exc:
        raise bad("--algo", exc) from None
    if args.json:
        print(json.dumps(rows, indent=2, allow_nan=False))
    elif args.csv:
        print(csv_text(rows), end="")
    else:
        print(f"# {args.op} on {args.topology} ({num_gpus} GPUs), algorithm {args.algo}, {layer}; GB = 1e9 bytes")
        print(table(rows))
    if args.plot:
        _plot(args, graph, sizes)
    return 0


_FLAG_OF_ERROR = (("system", "--nccl"), ("NCCL version", "--nccl-version"))  # NcclConfig's complaint -> its flag


def _nccl_layer(args: argparse.Namespace, graph) -> str:
    """Put the NCCL layer's settings on the graph as the flags say; a line saying which."""
    from clustersim.sim.collectives.fabric import gpu_link_Bps
    from clustersim.sim.collectives.nccl import NCCL, NcclConfig, system_for
    from clustersim.topologies.dgx import GPUS_PER_NODE

    system = args.nccl
    if system == "auto":  # DGX-like: nodes of GPUs on an NVSwitch at an A100's or H100's NVLink rate
        nodes = graph.graph.get(GPUS_PER_NODE)
        system = system_for(gpu_link_Bps(graph, "nvswitch")) if nodes else None
    if system in (None, "off"):
        return "NCCL layer off"
    version = {"version": args.nccl_version} if args.nccl_version else {}
    try:
        config = NcclConfig(system, args.protocol, args.tree, args.nvls, args.pxn, args.copy_engine, **version)
    except ValueError as exc:
        flag = next((f for word, f in _FLAG_OF_ERROR if word in str(exc)), "--protocol")
        raise ScenarioError("(command line)", flag, str(exc)) from None
    graph.graph[NCCL] = config
    return f"NCCL layer on ({system})"


def _plot(args: argparse.Namespace, graph, sizes: list[int]) -> None:
    """busbw vs size of `auto` and of every algorithm of the collective that runs on this graph."""
    from clustersim.sim.collectives import ALGORITHMS, CollectiveError
    from clustersim.sim.collectives.nccl_table import sweep
    from clustersim.sim.views.collectives import draw_busbw

    curves = {}
    for algo in ["auto", *ALGORITHMS[args.op]]:
        try:
            rows = sweep(graph, args.op, algo, sizes, args.type, args.redop, args.root)
        except CollectiveError:
            continue  # an algorithm that does not run here (needs a torus, NVLS, ...) has no curve
        curves[algo] = ([r["size_bytes"] for r in rows], [r["busbw_GBps"] for r in rows])
    draw_busbw(curves, args.plot, f"{args.op} on {args.topology}")
    print(f"wrote {args.plot}")


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


def add_key_flags(command: argparse.ArgumentParser) -> None:
    """One flag per YAML key of any topology kind (`--link_bandwidth 25GB/s`, also spelt
    `--link-bandwidth`), setting that key of the spec; a key its kind does not take is an error."""
    group = command.add_argument_group(
        "topology keys", "the YAML keys of cluster.topology, set on the spec (the kinds taking each in brackets)"
    )
    for key, help_text in key_flags().items():
        spellings = dict.fromkeys((f"--{key}", f"--{key.replace('_', '-')}"))
        group.add_argument(*spellings, dest=_dest(key), metavar="VALUE", help=help_text)


def topology_command(args: argparse.Namespace) -> int:
    import os
    import tempfile

    from clustersim.sim.build import build_topology
    from clustersim.sim.views.topology import draw_topology
    from clustersim.topologies.schema import NODE_KINDS, TOPOLOGY

    if Path(args.scenario).suffix in (".yaml", ".yml") or ":" not in args.scenario:
        if given := _key_flags_given(args):
            reason = "sets a key of a topology spec; a scenario file sets its keys in cluster.topology"
            raise ScenarioError("(command line)", f"--{next(iter(given))}", reason)
        scenario = load_scenario(args.scenario)
        graph, name = build_topology(scenario), scenario.name
    else:  # a topology spec such as torus:4x4x4
        graph = _spec_graph(args, args.scenario, "SCENARIO")
        name = args.scenario
    default = Path("runs") / "topology" / (re.sub(r"[^A-Za-z0-9_.-]+", "_", name) + ".png")  # in no run's folder
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
