"""Golden summaries: every bundled scenario's summary.json saved before a refactor, compared after.

`python tests/golden_summaries.py save` writes tests/golden/<scenario>.json (reduced mode, as
tests/test_scenarios.py runs them); `check` compares a fresh run against them, number for number;
`--only TEXT` limits either to the scenarios whose path contains TEXT (a deliberate change re-saves
only the goldens it moves).
`--full` runs every scenario at its real size into DIR instead (the 128-GPU PTD-P one takes
minutes and ~11 GB). A behaviour-preserving change leaves every number bit for bit the same.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
SCENARIOS = sorted((ROOT / "scenarios").rglob("*.yaml"))
BENCH_ONLY_GPUS = 1024  # above this a scenario runs only with --full


def reduced(scenario):
    """Above 32 GPUs, the fewest microbatches the scenario's schedule allows; same cluster, model
    and layout (the schedule registry says how few: pp for interleaved, 1 otherwise)."""
    from clustersim.schedules.pipeline import SCHEDULES

    if scenario.num_gpus <= 32:
        return scenario
    p, t = scenario.parallel, scenario.training
    microbatches = SCHEDULES[scenario.schedule].fewest_microbatches(scenario.schedule, p.pp, p.virtual)
    training = t.model_copy(update={"global_batch": t.micro_batch * p.dp * microbatches})
    return scenario.model_copy(update={"training": training})


def summaries(path: Path, full: bool) -> dict[str, dict]:
    """name -> summary.json contents (as JSON text reads back) of every scenario in the file."""
    from clustersim.sim.run import simulate
    from clustersim.sim.scenario.loader import load_scenarios

    out = {}
    for scenario in load_scenarios(path):
        if not full:
            scenario = reduced(scenario)
            if scenario.num_gpus > BENCH_ONLY_GPUS:
                continue
        out[scenario.name] = json.loads(json.dumps(simulate(scenario).summary, sort_keys=True))
    return out


def differences(old, new, where: str = "") -> list[str]:
    """Every path at which two JSON values differ (floats compared exactly)."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted(set(old) | set(new))
        return [
            d
            for k in keys
            for d in (
                differences(old.get(k), new.get(k), f"{where}.{k}")
                if k in old and k in new
                else [f"{where}.{k}: only in one"]
            )
        ]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in differences(a, b, f"{where}[{i}]")]
    return [] if old == new else [f"{where}: {old!r} != {new!r}"[:300]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("save", "check"))
    parser.add_argument("--full", metavar="DIR", help="full-size runs, saved in or checked against DIR")
    parser.add_argument("--only", metavar="TEXT", help="only the scenarios whose path contains TEXT")
    args = parser.parse_args()
    folder = Path(args.full) if args.full else GOLDEN
    folder.mkdir(parents=True, exist_ok=True)
    failed = 0
    for path in [p for p in SCENARIOS if args.only is None or args.only in str(p)]:
        target = folder / (path.relative_to(ROOT / "scenarios").with_suffix("").as_posix().replace("/", "__") + ".json")
        if args.action == "check" and not target.exists():  # a scenario added since the goldens were saved
            print(f"new     {path.relative_to(ROOT)} (no golden to compare with; `save` makes one)")
            continue
        got = summaries(path, bool(args.full))
        if args.action == "save":
            target.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
            print(f"saved {target}")
            continue
        diff = differences(json.loads(target.read_text()), got)
        failed += bool(diff)
        print(f"{'DIFFERS' if diff else 'same   '} {path.relative_to(ROOT)}")
        for line in diff[:20]:
            print(f"    {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
