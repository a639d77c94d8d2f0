"""ranks.csv and links.csv read back to the numbers of summary.json and the link statistics."""

import csv

import pytest

from clustersim.sim.cli import main
from clustersim.sim.results.links import link_stats
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario

from repo import QUICKSTART


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_run_writes_tables_that_read_back_to_the_summary_and_the_links(out_dir, capsys):
    assert main(["run", str(QUICKSTART), "-o", str(out_dir), "--no-plots", "--no-trace", "--no-program"]) == 0
    result = simulate(load_scenario(QUICKSTART))
    summary = result.summary
    ranks = read(out_dir / "ranks.csv")
    assert [int(r["rank"]) for r in ranks] == list(range(4))
    for r in ranks:
        rank = int(r["rank"])
        assert float(r["bubble_fraction"]) == summary["bubble_fraction_per_rank"][rank]  # exact: repr round-trips
        assert float(r["megatron_bubble_over_ideal"]) == summary["megatron_bubble_over_ideal_per_rank"][rank]
        assert int(r["peak_inflight_microbatches"]) == summary["peak_inflight_microbatches_per_rank"][rank]
        assert float(r["memory_total_bytes"]) == summary["memory_peak_bytes_per_rank"][str(rank)]["total"]
        assert float(r["sent_send_bytes"]) == summary["comm_bytes_sent_per_rank"][str(rank)].get("send", 0.0)
    stats = link_stats(result.log)
    links = read(out_dir / "links.csv")
    assert len(links) == int((stats.bytes > 0).sum()) > 0
    by_name = {name: i for i, name in enumerate(stats.names)}
    for row in links:
        i = by_name[row["link"]]
        assert float(row["bytes"]) == stats.bytes[i]
        # utilisation = bytes / (bandwidth x step time), the summary's definition
        assert float(row["utilisation"]) == pytest.approx(
            float(row["bytes"]) / (float(row["bandwidth_Bps"]) * summary["step_time_s"]), rel=1e-12
        )
