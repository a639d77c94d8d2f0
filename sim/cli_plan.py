"""The `clustersim plan` and `clustersim sweep` commands: their flags and their handlers (the
search itself is sim/plan's); an interruption keeps the candidates already simulated."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from clustersim.sim.folder import Terminated
from clustersim.sim.scenario.schema import ScenarioError


def add_plan_commands(sub) -> None:
    """The plan and sweep subcommands, on `sub` (the top parser's subparsers)."""
    plan = sub.add_parser("plan", help="search the parallel strategies for a scenario's model, cluster and batch")
    plan.add_argument("scenario", help="scenario YAML file (its model, cluster and global batch)")
    plan.add_argument("-o", "--output", help="output folder (default: runs/plan-<name>); a rerun into it resumes")
    plan.add_argument("--top", type=int, help="how many of the best estimated strategies to simulate (default 6)")
    add_dask_flags(plan)
    plan.set_defaults(func=plan_command)
    swp = sub.add_parser("sweep", help="simulate every combination of some scenario values")
    swp.add_argument("scenario", help="scenario YAML file")
    swp.add_argument(
        "--set",
        action="append",
        required=True,
        metavar="PATH=V1,V2,...",
        help="a dotted scenario path and its values, e.g. parallel.tp=1,2,4,8 (repeat for a grid)",
    )
    swp.add_argument("-o", "--output", help="output folder (default: runs/sweep-<name>); a rerun into it resumes")
    add_dask_flags(swp)
    swp.set_defaults(func=sweep_command)


def plan_command(args: argparse.Namespace) -> int:
    from clustersim.sim.plan.commands import DEFAULT_TOP, Cluster, plan, print_outcome

    top = DEFAULT_TOP if args.top is None else args.top
    cluster = Cluster(args.scheduler, workers_flag(args.workers))
    return resumable(lambda: print_outcome(plan(args.scenario, args.output, top, cluster)))


def sweep_command(args: argparse.Namespace) -> int:
    from clustersim.sim.plan.commands import Cluster, print_outcome, sweep

    cluster = Cluster(args.scheduler, workers_flag(args.workers))
    return resumable(lambda: print_outcome(sweep(args.scenario, args.set, args.output, cluster)))


def resumable(work: Callable[[], None]) -> int:
    """Run a plan or sweep; an interruption keeps what finished (the folder's results file)."""
    try:
        work()
    except (KeyboardInterrupt, Terminated) as exc:
        signal_name, code = ("SIGINT", 130) if isinstance(exc, KeyboardInterrupt) else ("SIGTERM", 143)
        print(
            f"clustersim: interrupted ({signal_name}); the candidates simulated so far are kept: "
            "rerun the same command to resume",
            file=sys.stderr,
        )
        return code
    return 0


def workers_flag(workers: int | None) -> int | None:
    if workers is not None and workers < 1:
        raise ScenarioError("(command line)", "--workers", f"must be >= 1, got {workers}")
    return workers


def add_dask_flags(command: argparse.ArgumentParser) -> None:
    command.add_argument("--scheduler", metavar="ADDRESS", help="an existing Dask scheduler (default: a local cluster)")
    command.add_argument("--workers", type=int, help="local cluster's worker processes (default: one per core)")
