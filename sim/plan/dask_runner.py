"""Candidates simulated in full on Dask distributed, resumably.

Each candidate is a scenario (its data, validated again on the worker) simulated by the real
engine (sim.run.simulate); its row (sim.compare.compare_row: step time, compute, bubble,
exposed communication by kind, MFU, memory peak) is appended to a results file, one JSON line
per finished candidate keyed by the candidate's hash (sim.plan.space.candidate_key). A rerun
reads the file and submits only the candidates it does not hold, so an interrupted plan or
sweep resumes from what is done.

The cluster: a LocalCluster of one single-threaded worker process per core by default (the
engine is pure Python: threads would share one interpreter lock), or an existing cluster's
scheduler (`--scheduler tcp://host:8786`), whose workers need clustersim installed.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dask.distributed import Client, LocalCluster, as_completed

from clustersim.sim.progress import candidate_progress

RESULTS_FILE = "results.jsonl"


def simulate_candidate(data: dict, filename: str) -> dict:
    """On a worker: validate the candidate's scenario data, simulate it, return its row."""
    from clustersim.sim.compare import compare_row
    from clustersim.sim.run import simulate
    from clustersim.sim.scenario.loader import validate_data

    started = time.perf_counter()
    result = simulate(validate_data(data, filename))
    row = compare_row(result)
    row["simulation_wall_s"] = time.perf_counter() - started  # what the candidate cost to simulate
    del row["hottest_links"]
    peaks = result.summary["memory_peak_bytes_per_rank"]
    row["memory_peak_bytes_per_rank"] = [peaks[rank]["total"] for rank in sorted(peaks, key=int)]
    return row


def finished(results_path: Path) -> dict[str, dict]:
    """Rows already in the results file, by candidate key (a line cut short by a kill is skipped)."""
    rows: dict[str, dict] = {}
    if not results_path.is_file():
        return rows
    for line in results_path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and "key" in entry and "row" in entry:
            rows[entry["key"]] = entry["row"]
    return rows


@contextmanager
def dask_client(scheduler: str | None, workers: int | None, processes: bool = True) -> Iterator[Client]:
    """A client of the cluster at `scheduler`, or of a LocalCluster of `workers` (default: all cores)."""
    if scheduler:
        with Client(scheduler) as client:
            yield client
        return
    with (
        LocalCluster(
            n_workers=workers or os.cpu_count() or 1,
            threads_per_worker=1,
            processes=processes,
            dashboard_address=":0",  # any free port (no dashboard without bokeh)
            silence_logs=logging.CRITICAL,  # a worker cut off by an interruption is not news
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


ESTIMATE_CHUNK = 250  # candidates per estimating task: a few seconds of work each


def estimate_all(client: Client, data: dict, filename: str, candidates: list[dict]) -> list[float | None]:
    """Every candidate's estimated step time (None: over memory), computed in chunks on the
    cluster's workers (sim.plan.estimate.estimate_chunk), in the candidates' order."""
    from clustersim.sim.plan.estimate import estimate_chunk

    chunks = [candidates[i : i + ESTIMATE_CHUNK] for i in range(0, len(candidates), ESTIMATE_CHUNK)]
    steps: list[list[float | None]] = [[] for _ in chunks]
    with candidate_progress(len(candidates), 0, "estimating", unit="candidate") as advance:
        futures = {
            client.submit(estimate_chunk, data, filename, chunk, pure=False): i for i, chunk in enumerate(chunks)
        }
        for future in as_completed(futures):
            steps[futures[future]] = future.result()
            advance(len(steps[futures[future]]))
    return [step for chunk_steps in steps for step in chunk_steps]


def run_candidates(jobs: dict[str, dict], filename: str, results_path: Path, client: Client, label: str) -> dict:
    """Simulate every job (key -> scenario data) not yet in `results_path`, appending each row as
    it finishes; return the rows of all jobs, by key. A simulation that raises leaves a row with
    its error, so a rerun does not retry what cannot run."""
    done = finished(results_path)
    todo = {key: data for key, data in jobs.items() if key not in done}
    rows = {key: done[key] for key in jobs if key in done}
    with candidate_progress(len(jobs), len(jobs) - len(todo), label) as advance:
        if not todo:
            return rows
        futures = {
            client.submit(simulate_candidate, data, filename, key=f"simulate-{key}"): key for key, data in todo.items()
        }
        with results_path.open("a", encoding="utf-8") as results:
            if results.tell() and not results_path.read_bytes().endswith(b"\n"):
                results.write("\n")  # after a line cut short by a kill: the next row starts its own line
            for future in as_completed(futures):
                key = futures[future]
                try:
                    row = future.result()
                except Exception as exc:  # noqa: BLE001 (reported in the row, the sweep goes on)
                    row = {"error": f"{type(exc).__name__}: {exc}"}
                rows[key] = row
                results.write(json.dumps({"key": key, "row": row}) + "\n")
                results.flush()
                advance()
    return rows
