"""`clustersim plan` and `clustersim sweep`: candidates (sim.plan.space) -> the analytical filter
and ranking (sim.plan.estimate, plan only) -> full simulations on Dask, resumable
(sim.plan.dask_runner) -> table, CSV, Pareto plot and the best scenario (sim.plan.report).

Both write into a folder checked like a run's (sim.folder: absent or clustersim's, never a
user's, checked before anything is simulated) and filled as candidates finish, so a rerun into
the same folder resumes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clustersim.sim.folder import check_target, resumable_folder
from clustersim.sim.plan.dask_runner import RESULTS_FILE, dask_client, estimate_all, run_candidates
from clustersim.sim.plan.estimate import estimate, fabric_of
from clustersim.sim.plan.report import best_row, best_scenario_text, result_row, table, write_rows
from clustersim.sim.plan.space import STRATEGY_KEYS, candidate_key, grid, parse_set, scenario_of, valid_candidates
from clustersim.sim.scenario.errors import ScenarioError
from clustersim.sim.scenario.loader import scenario_data, validate_data, with_overrides

DEFAULT_TOP = 6
BEST_FILE = "best.yaml"


@dataclass(frozen=True)
class Outcome:
    """What a plan or sweep did: its folder, its rows, the files written, how candidates fell."""

    folder: Path
    rows: list[dict]
    files: list[str]
    counts: dict[str, int]
    best: dict | None


@dataclass(frozen=True)
class Cluster:
    """Where the simulations run: an existing scheduler's address, or a LocalCluster's size."""

    scheduler: str | None = None
    workers: int | None = None
    processes: bool = True


def plan(path: str, out: str | Path | None, top: int, cluster: Cluster) -> Outcome:
    """Enumerate, prune, rank and simulate the top `top` strategies for the scenario at `path`
    (and its own strategy, always), then write the outputs."""
    if top < 1:
        raise ScenarioError("(command line)", "--top", f"must be >= 1, got {top}")
    data = scenario_data(path)
    base = validate_data(data, path)
    folder = check_target(Path(out) if out else Path("runs") / f"plan-{base.name}")  # before any work
    with resumable_folder(folder, "plan"), dask_client(cluster.scheduler, cluster.workers, cluster.processes) as client:
        kept, refused = valid_candidates(data, base, path)
        steps = estimate_all(client, data, path, [overrides for overrides, _ in kept])
        ranked = sorted(
            ((step, overrides) for step, (overrides, _) in zip(steps, kept) if step is not None), key=lambda p: p[0]
        )  # stable: ties keep the enumeration's order
        own = {path_: _value_at(base.model_dump(by_alias=True), path_) for path_ in STRATEGY_KEYS}
        chosen = top_diverse(ranked, top)
        if all(overrides != own for _, overrides in chosen):  # the scenario's own strategy is always simulated
            chosen.append((estimate(base, fabric_of(base)).step_time_s, own))
        jobs = {candidate_key(data, overrides): (estimated, overrides) for estimated, overrides in chosen}
        counts = {
            "enumerated": len(kept) + refused,
            "refused_by_loader": refused,
            "over_memory": len(kept) - len(ranked),
            "ranked": len(ranked),
            "simulated": len(jobs),
        }
        simulated = run_candidates(
            {key: with_overrides(data, overrides, path) for key, (_, overrides) in jobs.items()},
            path,
            folder / RESULTS_FILE,
            client,
            "simulating",
        )
        rows = [result_row(key, overrides, simulated[key], estimated) for key, (estimated, overrides) in jobs.items()]
        best = best_row(rows)
        files = write_rows(folder, "plan", rows, f"clustersim plan {base.name}: {len(rows)} simulated", best)
        if best is not None:
            best_data = with_overrides(data, jobs[best["key"]][1], path)
            (folder / BEST_FILE).write_text(best_scenario_text(best_data, path, best))
            files.append(BEST_FILE)
    return Outcome(folder, rows, files, counts, best)


SHAPE_KEYS = ("parallel.tp", "parallel.pp", "parallel.ep", "schedule", "parallel.zero")


def top_diverse(ranked: list[tuple[float, dict]], top: int) -> list[tuple[float, dict]]:
    """The `top` best estimated, at most one per shape (tp, pp, ep, schedule, ZeRO stage) while
    shapes last, then the next best: an estimate errs alike on candidates of one shape (the
    virtual count or microbatch size apart), so the simulations are spread over the shapes."""
    firsts: dict[tuple, tuple[float, dict]] = {}
    for pair in ranked:
        firsts.setdefault(tuple(pair[1][k] for k in SHAPE_KEYS), pair)
    chosen = list(firsts.values())[:top]
    rest = [pair for pair in ranked if all(pair is not c for c in chosen)]
    return sorted(chosen + rest[: top - len(chosen)], key=lambda pair: pair[0])


def sweep(path: str, sets: list[str], out: str | Path | None, cluster: Cluster) -> Outcome:
    """Simulate every combination of the `--set PATH=V1,V2` values the loader accepts. A value
    with which no combination is a valid scenario is an error (the loader's, one line); other
    refused combinations are listed in the CSV with the loader's reason."""
    data = scenario_data(path)
    base = validate_data(data, path)
    folder = check_target(Path(out) if out else Path("runs") / f"sweep-{base.name}")
    combos = grid([parse_set(text) for text in sets])
    errors: list[ScenarioError | None] = []
    for overrides in combos:
        try:
            scenario_of(data, overrides, path)
            errors.append(None)
        except ScenarioError as exc:
            errors.append(exc)
    _refuse_hopeless_values(combos, errors)
    jobs = {candidate_key(data, o): o for o, e in zip(combos, errors) if e is None}
    with (
        resumable_folder(folder, "sweep"),
        dask_client(cluster.scheduler, cluster.workers, cluster.processes) as client,
    ):
        simulated = run_candidates(
            {key: with_overrides(data, o, path) for key, o in jobs.items()},
            path,
            folder / RESULTS_FILE,
            client,
            "sweep",
        )
        rows = [
            result_row(key, o, simulated[key] if e is None else {"error": f"refused: {e.path}: {e.reason}"})
            for o, e in zip(combos, errors)
            for key in [candidate_key(data, o)]
        ]
        best = best_row(rows)
        files = write_rows(folder, "sweep", rows, f"clustersim sweep {base.name}: {len(jobs)} simulated", best)
    counts = {"combinations": len(combos), "refused_by_loader": len(combos) - len(jobs), "simulated": len(jobs)}
    return Outcome(folder, rows, files, counts, best)


def _refuse_hopeless_values(combos: list[dict], errors: list[ScenarioError | None]) -> None:
    """Raise the loader's error for a --set value that no combination can use (a bad path, a
    wrong type, tp not dividing the heads): the first refusal among its combinations."""
    for path_, value in dict.fromkeys((p, repr(v)) for combo in combos for p, v in combo.items()):
        mine = [e for combo, e in zip(combos, errors) if repr(combo[path_]) == value]
        if all(e is not None for e in mine):
            raise mine[0]  # type: ignore[misc]


def _value_at(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for key in dotted.split("."):
        node = node[key]
    return node


def print_outcome(outcome: Outcome) -> None:
    """The table, how the candidates fell, the best one, and the files written."""
    print(table(outcome.rows))
    print("\n" + ", ".join(f"{k.replace('_', ' ')}: {v:,}" for k, v in outcome.counts.items()))
    if outcome.best is not None:
        print(f"best: {outcome.best['label']}: step {outcome.best['step_time_s']:.4f} s")
    print(f"wrote {outcome.folder}/: {' '.join(outcome.files)} {RESULTS_FILE}")
