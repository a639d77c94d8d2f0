"""`clustersim plan` and `sweep` end to end on a real dask.distributed LocalCluster (threads, to
stay light): outputs, the best scenario that loads and runs to the same step, the resume path,
the sweep's CSV against direct simulations, and bad --set input."""

import csv
import json
import re
from pathlib import Path

import pytest

from clustersim.sim.cli import main
from clustersim.sim.folder import MARKER, OutputError
from clustersim.sim.plan.commands import Cluster, plan, sweep
from clustersim.sim.plan.dask_runner import RESULTS_FILE
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario, load_scenario_text

pytestmark = pytest.mark.slow
THREADS = Cluster(workers=2, processes=False)


def test_plan_end_to_end_and_resume(small, tmp_path):
    out = tmp_path / "plan"
    first = plan(small, out, 3, THREADS)
    assert (out / MARKER).is_file()
    assert {"plan.csv", "plan.txt", "pareto.png", "best.yaml"} <= set(first.files)
    lines = (out / RESULTS_FILE).read_text().splitlines()
    assert len(lines) == first.counts["simulated"] == len(first.rows)
    assert first.counts["simulated"] in (3, 4)  # the top 3, and the scenario's own strategy unless among them
    own = load_scenario(small)
    assert any(r["tp"] == 1 and r["pp"] == 2 and r["schedule"] == "1f1b" and r["zero"] == 0 for r in first.rows)
    # the best plan is a scenario that loads and runs to the step the plan reports, and is no slower than the own
    best = load_scenario(out / "best.yaml")
    assert simulate(best).summary["step_time_s"] == first.best["step_time_s"]
    assert first.best["step_time_s"] <= simulate(own).summary["step_time_s"]
    with open(out / "plan.csv") as f:
        assert len(list(csv.DictReader(f))) == len(first.rows)
    # a rerun simulates nothing new and gives the same rows
    second = plan(small, out, 3, THREADS)
    assert (out / RESULTS_FILE).read_text().splitlines() == lines
    assert second.rows == first.rows and second.best == first.best


def test_plan_resumes_an_interrupted_results_file(small, tmp_path):
    """A results file cut short (a kill mid-line) keeps its whole lines; the rest is simulated."""
    out = tmp_path / "plan"
    plan(small, out, 2, THREADS)
    lines = (out / RESULTS_FILE).read_text().splitlines()
    (out / RESULTS_FILE).write_text(lines[0] + "\n" + lines[1][:20])
    again = plan(small, out, 2, THREADS)
    now = (out / RESULTS_FILE).read_text().splitlines()
    assert now[:2] == [lines[0], lines[1][:20]]
    done = [json.loads(line)["key"] for line in now[2:]]
    assert sorted(done) == sorted(r["key"] for r in again.rows if r["key"] != json.loads(lines[0])["key"])
    assert again.rows == plan(small, out, 2, THREADS).rows  # and now it is complete


def test_plan_refuses_a_folder_of_the_users_before_any_work(small, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="not a clustersim run folder"):
        plan(small, mine, 2, THREADS)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_sweep_csv_holds_each_combination_as_simulated(small, tmp_path):
    """pp x dp over 1, 2, 4: the three whose product is the 8 GPUs / tp run, the others are
    listed as refused with the loader's reason; each step time equals a direct simulation."""
    out = tmp_path / "sweep"
    outcome = sweep(small, ["parallel.pp=1,2,4", "parallel.dp=2,4,8"], out, THREADS)
    with open(out / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(int(r["pp"]), int(r["dp"])) for r in rows] == [(p, d) for p in (1, 2, 4) for d in (2, 4, 8)]
    ran = [r for r in rows if not r["error"]]
    assert [(int(r["pp"]), int(r["dp"])) for r in ran] == [(1, 8), (2, 4), (4, 2)]
    assert all("refused: parallel:" in r["error"] and "!= 8 GPUs" in r["error"] for r in rows if r["error"])
    for r in ran:
        text = Path(small).read_text().replace("pp: 2, dp: 4", f"pp: {r['pp']}, dp: {r['dp']}")
        assert float(r["step_time_s"]) == simulate(load_scenario_text(text)).summary["step_time_s"]
    assert "pareto.png" in outcome.files


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("parallel.tq=1,2", r"parallel\.tq: unknown key 'tq'"),
        ("parallel.tp=x", r"parallel\.tp: expected an integer, got 'x'"),
        ("parallel.tp=8", r"parallel\.tp: 8 does not divide model\.heads \(12\)"),
        ("training.global_batch.x=1", r"training\.global_batch\.x: 'global_batch' is not a section"),
    ],
)
def test_sweep_bad_set_is_one_line_exit_2(small, tmp_path, capsys, setting, message):
    code = main(["sweep", small, "--set", setting, "-o", str(tmp_path / "sweep")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("clustersim: error: ") and re.search(message, err)
    assert not (tmp_path / "sweep").exists()
