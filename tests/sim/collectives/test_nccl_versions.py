"""The NCCL release as a property of the run: each release's ring constants as its tuning.cc has them
(read at the release tags of NVIDIA/nccl), and the rates the layer runs at under them."""

from __future__ import annotations

import pytest

from clustersim.sim.collectives import nccl, nccl_tuning, nccl_versions
from clustersim.sim.collectives.run import time_collective
from clustersim.sim.scenario.spec import parse_spec

MiB = 2**20
A100_NODE = "dgx:1,nvlink_bandwidth_Bps=300e9"


def a100_node(version: str) -> nccl_tuning.Shape:
    return nccl_tuning.Shape(8, 1, "ampere", 12, 0.0, 0, False, nccl_versions.parse(version))


def test_constants_switch_at_the_releases_that_changed_them():
    ring = nccl_versions.ring_constants
    # tuning.cc: `busBw * 1.0/4.0` for a ring LL all-reduce up to v2.20.5, `busBw * .5` from v2.21.5
    assert ring((2, 20, 5)).ll_factor_all_reduce == 0.25 and ring((2, 21, 5)).ll_factor_all_reduce == 0.5
    # baseLat ring LL 3.6 and the 235 GB/s Ampere cap in v2.17.1; 6.6 and no cap from v2.18.1 (the latest's)
    assert ring((2, 17, 1)).base_latency_us == (3.6, 10.0, 8.4) and ring((2, 17, 1)).ampere_bus_cap_GBps == 235
    assert ring((2, 18, 1)).base_latency_us is None and ring((2, 18, 1)).ampere_bus_cap_GBps == float("inf")
    # ll128MaxBwPerCh per collective in v2.9.9 (all-reduce 16.9), one 20.0 from v2.10.3
    assert ring((2, 9, 9)).ampere_ll128_per_channel_GBps["all_reduce"] == 16.9
    assert ring((2, 10, 3)).ampere_ll128_per_channel_GBps == {}
    assert nccl_versions.parse(nccl.NcclConfig().version) == nccl_versions.LATEST_RELEASE


def test_nccl_2_9_9_model_on_one_a100_node_is_its_tuning_cc():
    shape = a100_node("2.9.9")
    # ring LL: 3.6 us + 14 steps x 0.47; min(llMaxBw 87.7, min(12 x 20, 235) / 4) x 8/14
    latency, bw = nccl_tuning.model("all_reduce", "ring", "LL", shape)
    assert latency == pytest.approx(3.6 + 14 * 0.47) and bw == pytest.approx(235 / 4 * 8 / 14)
    # ring LL128: 10.0 us + 14 x 1.9; min(235 x 0.92, 12 channels x 16.9) x 8/14
    latency, bw = nccl_tuning.model("all_reduce", "ring", "LL128", shape)
    assert latency == pytest.approx(10.0 + 14 * 1.9) and bw == pytest.approx(12 * 16.9 * 8 / 14)
    # all-gather on one node: LL at a third of the bus, 235 / 3 x 8/7
    assert nccl_tuning.model("all_gather", "ring", "LL", shape)[1] == pytest.approx(235 / 3 * 8 / 7)
    # the latest: 240 x 0.5 = 120 within llMaxBw 87.7
    assert nccl_tuning.model("all_reduce", "ring", "LL", a100_node(nccl_versions.LATEST))[1] == pytest.approx(
        87.7 * 8 / 14
    )


@pytest.mark.parametrize(("version", "ll_over_simple"), [("2.9.9", (235 / 4) / 235), ("2.30.7", 87.7 / 240)])
def test_a_forced_ll_all_reduce_runs_at_its_releases_share_of_the_sm_rate(version, ll_over_simple):
    # 256 MiB forced to LL: bus bandwidth = the SMs' 230 GB/s (nccl.SYSTEMS) x LL's share of Simple in
    # that release's tuning.cc, within the ~35 us of per-call latency (0.5% of the ~4-6 ms call)
    graph = parse_spec(A100_NODE)
    graph.graph[nccl.NCCL] = nccl.NcclConfig("A100", protocol="LL", version=version)
    nbytes = 256 * MiB
    seconds, _ = time_collective(graph, "all_reduce", "nccl_ring", None, float(nbytes))
    assert 2 * 7 / 8 * nbytes / seconds == pytest.approx(230e9 * ll_over_simple, rel=0.01)


@pytest.mark.parametrize("version", ["2.9", "v2.9.9", "2.7.8", "3.0.0"])
def test_a_version_outside_the_ported_releases_is_a_one_line_error(version):
    with pytest.raises(ValueError, match="NCCL version") as error:
        nccl.NcclConfig("A100", version=version)
    assert "\n" not in str(error.value)


def test_nvlink_sharp_exists_from_the_release_that_added_it():
    """src/transport/nvls.cc and NCCL_ALGO_NVLS appear in v2.17.1-1, NCCL_ALGO_NVLS_TREE in v2.18.1-1:
    a run on an older release is offered neither (one node: NVLS; more: NVLS-tree)."""

    def nvls(version: str, nodes: int) -> bool:
        return nccl.shape_of(nccl.NcclConfig("H100", version=version), nodes, 8 * nodes, 50e9, 8).nvls

    assert not nvls("2.16.5", 1) and nvls("2.17.1", 1)
    assert not nvls("2.17.1", 4) and nvls("2.18.1", 4)
    assert not nccl.shape_of(nccl.NcclConfig("A100"), 1, 8, None, 0).nvls  # no NVLS on A100 in any release


def test_a_scenario_and_the_command_line_name_the_release():
    from clustersim.sim.cli import main
    from clustersim.sim.scenario.loader import load_scenario_text
    from clustersim.sim.scenario.schema import ScenarioError

    text = """
name: v
cluster: {{gpu: A100-SXM-80GB, nodes: 1, gpus_per_node: 8, nccl: {{version: "{v}"}},
          topology: {{kind: dgx, link_latency: 1us}}}}
model: {{preset: tiny-8l}}
training: {{global_batch: 8, micro_batch: 1}}
parallel: {{tp: 8}}
numerics: {{enabled: false}}
"""
    assert load_scenario_text(text.format(v="2.9.9")).cluster.nccl.version == "2.9.9"
    with pytest.raises(ScenarioError, match=r"cluster\.nccl\.version.*outside the releases ported"):
        load_scenario_text(text.format(v="2.5.0"))
    args = ["collective", "all_reduce", "--topology", "dgx:1", "--sizes", "8KiB", "--nccl-version", "2.5.0"]
    assert main(args) == 2
