"""The strategies `clustersim plan` considers, and the grid `clustersim sweep` is given.

A candidate is a set of dotted-path overrides of the user's scenario ({"parallel.tp": 8, ...});
it becomes a scenario through the loader (sim.scenario.loader.with_overrides, validate_data), so
every candidate kept is exactly a scenario file the loader accepts, and every rule the loader
has (tp divides heads and ffn, pp x virtual divides layers, ep divides dp and the experts, the
batch splits into microbatches, the schedule's own sizes rule) prunes here too.

The enumeration only proposes values that can pass (divisors of what they must divide), so that
the loader refuses few: tp among the divisors of the GPU count up to one node's GPUs
(Narayanan et al. 2021, takeaway 1: tensor parallelism inside a node, where NVLink is), pp
dividing the layers, dp the rest, ep dividing dp and the experts (MoE models), microbatches of
1 to MAX_MICRO_BATCH sequences dividing a replica's batch, every registered schedule
(schedules.pipeline.SCHEDULES, so a new one joins by registering) with, for those that run
several chunks per rank, every virtual count dividing a rank's layers; ZeRO 0, 2 and 3 (0 alone
without data parallelism; ZeRO_STAGES says why not 1), recompute none / selective / full,
sequence parallelism off and on (tp > 1).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from typing import Any

from clustersim.schedules.pipeline import SCHEDULES, ScheduleError
from clustersim.sim.cost.memory import RECOMPUTE_MODES
from clustersim.sim.scenario.errors import ScenarioError
from clustersim.sim.scenario.loader import parse_yaml_value, validate_data, with_overrides
from clustersim.sim.scenario.schema import Scenario

# ZeRO 1 is left out: ZeRO 2 moves the same bytes at the same times and only holds less
# (schedules/data_parallel.py), so in this model ZeRO 1 is never better on either axis.
ZERO_STAGES = (0, 2, 3)
MAX_MICRO_BATCH = 8  # Megatron-LM's published runs use 1 to 8 sequences per microbatch
STRATEGY_KEYS = (
    "parallel.tp",
    "parallel.pp",
    "parallel.dp",
    "parallel.ep",
    "parallel.virtual",
    "training.micro_batch",
    "schedule",
    "parallel.zero",
    "training.recompute",
    "parallel.sequence_parallel",
)
Overrides = dict[str, Any]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def strategies(base: Scenario) -> Iterator[Overrides]:
    """Every strategy for `base`'s model, cluster and global batch (module docstring), before
    the loader's check."""
    m, c, batch = base.model_spec, base.cluster, base.training.global_batch
    for tp in divisors(c.num_gpus):
        if tp > c.gpus_per_node or m.heads % tp or m.ffn % tp:
            continue
        for pp in divisors(c.num_gpus // tp):
            dp = c.num_gpus // (tp * pp)
            if m.layers % pp or batch % dp:
                continue
            eps = [e for e in divisors(dp) if m.moe.num_experts % e == 0] if m.moe is not None else [1]
            for ep, mb in itertools.product(eps, divisors(batch // dp)):
                if mb > MAX_MICRO_BATCH:
                    break
                for schedule, virtual in _schedules(pp, batch // (dp * mb), m.layers // pp):
                    shape: Overrides = {"parallel.tp": tp, "parallel.pp": pp, "parallel.dp": dp, "parallel.ep": ep}
                    shape |= {"parallel.virtual": virtual, "training.micro_batch": mb, "schedule": schedule}
                    if base.parallel.stage_layers is not None and pp * virtual != base.parallel.num_stages:
                        shape["parallel.stage_layers"] = None  # the scenario's split is for its own stage count
                    for zero, recompute, sp in itertools.product(
                        ZERO_STAGES if dp > 1 else [0], RECOMPUTE_MODES, [False, True] if tp > 1 else [False]
                    ):
                        yield shape | {
                            "parallel.zero": zero,
                            "training.recompute": recompute,
                            "parallel.sequence_parallel": sp,
                        }


def _schedules(pp: int, microbatches: int, layers_per_rank: int) -> Iterator[tuple[str, int]]:
    """(schedule, virtual) pairs the registry's sizes rules accept; one schedule without a
    pipeline (pp 1: every schedule is the same sequence of microbatches)."""
    for name, entry in SCHEDULES.items():
        virtuals = [v for v in divisors(layers_per_rank) if v > 1] if entry.chunks_per_rank else [1]
        for virtual in virtuals:
            try:
                entry.check(name, pp, microbatches, virtual)
            except ScheduleError:
                continue
            yield name, virtual
        if pp == 1 and not entry.chunks_per_rank:
            return


def scenario_of(data: dict, overrides: Overrides, filename: str) -> Scenario:
    """The scenario a candidate makes of the scenario file's data (ScenarioError if the loader
    refuses it), named after the file's scenario."""
    return validate_data(with_overrides(data, overrides, filename), filename)


def candidate_key(data: dict, overrides: Overrides) -> str:
    """A stable name for a candidate: a hash of the scenario data it makes (the same file and
    overrides give the same key in any run, so a resumed plan finds what it did)."""
    text = json.dumps(with_overrides(data, overrides, "-"), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def valid_candidates(data: dict, base: Scenario, filename: str) -> tuple[list[tuple[Overrides, Scenario]], int]:
    """The strategies the loader accepts, each with its scenario, and how many it refused."""
    kept, refused = [], 0
    for overrides in strategies(base):
        try:
            kept.append((overrides, scenario_of(data, overrides, filename)))
        except ScenarioError:
            refused += 1
    return kept, refused


def parse_set(text: str) -> tuple[str, list[Any]]:
    """A sweep's `--set PATH=V1,V2,...` -> (path, values), each value read as YAML reads it; commas
    inside brackets belong to the value (`parallel.order=[dp,pp,tp],[pp,dp,tp]`)."""
    path, sep, values = text.partition("=")
    if not sep or not path.strip() or not values.strip():
        raise ScenarioError("(command line)", "--set", f"expected PATH=VALUE[,VALUE...], got {text!r}")
    parts, depth, current = [], 0, ""
    for char in values:
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return path.strip(), [parse_yaml_value(part.strip()) for part in parts]


def grid(sets: list[tuple[str, list[Any]]]) -> list[Overrides]:
    """Every combination of the --set values, in the order given (the last --set fastest)."""
    paths = [path for path, _ in sets]
    return [dict(zip(paths, combo)) for combo in itertools.product(*(values for _, values in sets))]
