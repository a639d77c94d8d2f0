"""The NCCL layer: its tuning arithmetic against NVIDIA/nccl's source, the ring per rail on the
per-link ledger, NVLS's port-load closed form with its pipeline fill, and the CLI's switches."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from clustersim.sim.cli import main
from clustersim.sim.collectives import nccl, nccl_tuning
from clustersim.sim.collectives.nccl_algorithms import double_tree
from clustersim.sim.collectives.run import resolve_protocol, run_collective, time_collective
from clustersim.sim.network.network import Network
from clustersim.sim.scenario.spec import parse_spec

GiB = 2**30
A100_4NODES = "fattree:nodes=4,gpus_per_node=8,nvlink_bandwidth_Bps=300e9,nic_bandwidth_Bps=25e9"


def shape(nodes: int, arch: str, nvlinks: int, nic_GBps: float) -> nccl_tuning.Shape:
    return nccl_tuning.Shape(8 * nodes, nodes, arch, nvlinks, nic_GBps, 8 if nodes > 1 else 0, arch == "hopper")


def test_ring_search_gives_nccls_channels_and_speeds():
    # search.cc: A100 one node, 12 x 20 GB/s NVLink = 240: speed 40 fits 6 channels, doubled (>= 25) to 12 x 20
    assert nccl_tuning.ring_graph(shape(1, "ampere", 12, 0)) == nccl_tuning.Graph(12, 20.0, 20.0)
    # four nodes, HDR 25 GB/s NICs: one channel per NIC at 24 GB/s (the fastest inter speed <= 25), not doubled
    assert nccl_tuning.ring_graph(shape(4, "ampere", 12, 25)) == nccl_tuning.Graph(8, 24.0, 24.0)
    # H100 one node, 18 x 20.6 = 370.8: sm90 speed 60 fits 6 channels, doubled to 12 x 30
    assert nccl_tuning.ring_graph(shape(1, "hopper", 18, 0)) == nccl_tuning.Graph(12, 30.0, 30.0)


def test_protocol_choice_follows_size():
    s = shape(1, "ampere", 12, 0)
    assert nccl_tuning.choose("all_reduce", 8 * 2**10, s, ("ring",), nccl_tuning.PROTOCOLS) == ("ring", "LL")
    assert nccl_tuning.choose("all_reduce", GiB, s, ("ring",), nccl_tuning.PROTOCOLS) == ("ring", "Simple")
    # ring LL on one A100 node: base 6.6 us + 14 steps x 0.6 us; bandwidth min(llMaxBw 87.7, 240 x 0.5) x 8/14
    latency, bw = nccl_tuning.model("all_reduce", "ring", "LL", s)
    assert latency == pytest.approx(6.6 + 14 * 0.6) and bw == pytest.approx(87.7 * 8 / 14)


def test_time_model_refinements_are_ncclTopoGetAlgoTimes():
    # treeCorrectionFactor at index log2(nbytes >> 6) below 23: 8 KiB -> 7 (LL .7), 1 MiB -> 14 (LL128 .6),
    # 64 MiB -> 20 (Simple .8); 512 MiB -> 23, none; a ring has none
    correction = nccl_tuning.tree_correction
    assert correction("tree", "LL", "all_reduce", 8 * 2**10) == 0.7
    assert correction("tree", "LL128", "all_reduce", 2**20) == 0.6
    assert correction("tree", "Simple", "all_reduce", 64 * 2**20) == 0.8
    assert correction("tree", "Simple", "all_reduce", 512 * 2**20) == 1.0
    assert correction("ring", "LL", "all_reduce", 8 * 2**10) == 1.0
    # ring plateau: latency x 1.4 for a multi-node Simple ring all-reduce with >= 64 bytes per channel and
    # rank (four A100 nodes: 8 channels x 32 ranks x 64 = 16 KiB)
    plateau, s4 = nccl_tuning.ring_plateau, shape(4, "ampere", 12, 25)
    assert plateau("ring", "Simple", "all_reduce", s4, 16384) == 1.4
    assert plateau("ring", "Simple", "all_reduce", s4, 16383) == 1.0
    assert plateau("ring", "LL", "all_reduce", s4, GiB) == 1.0
    assert plateau("ring", "Simple", "all_reduce", shape(1, "ampere", 12, 0), GiB) == 1.0
    latency, bw = nccl_tuning.model("all_reduce", "tree", "LL", s4)
    assert nccl_tuning.algo_time_us("all_reduce", "tree", "LL", s4, 8192) == pytest.approx(
        latency + 8192 / (bw * 0.7e3)
    )


def test_one_h100_node_picks_what_nccl_picked_in_nccl_tests_309():
    # nccl-tests#309 (NCCL 2.26.2, 8 H100 + NVSwitch, NCCL_DEBUG_SUBSYS=TUNING): "8B~1MB: RING, LL;
    # 2MB~16GB: NVLS, SIMPLE", which NVIDIA's reply confirms
    graph = parse_spec("dgx:1")
    graph.graph[nccl.NCCL] = nccl.NcclConfig(system="H100")
    sizes = [2**k for k in range(3, 35)]
    picks = [resolve_protocol(graph, "all_reduce", "auto", range(8), float(size)) for size in sizes]
    assert picks == [("nccl_ring", "LL") if size <= 2**20 else ("nvls", "Simple") for size in sizes]


def test_small_calls_run_on_fewer_channels():
    # enqueue.cc: drop channels while nbytes < channels x 512 threads x 8 bytes x 8 ranks (ring LL)
    s = shape(1, "ampere", 12, 0)
    assert nccl_tuning.channels_used("ring", "LL", s, 8 * 2**10) == (1, 12)
    assert nccl_tuning.channels_used("ring", "LL", s, 5 * 32 * 2**10) == (5, 12)
    assert nccl_tuning.channels_used("ring", "LL", s, 2**20) == (12, 12)
    assert nccl_tuning.channels_used("nvls", "Simple", shape(1, "hopper", 18, 0), 8) == (12, 12)


def test_double_tree_is_nccls_btree_and_its_mirror():
    # ncclGetBtree over 4: 0 is the root with child 2; 1 and 3 hang off 2. Mirror for an even count.
    first, second = double_tree(4)
    assert sorted(first) == [(1, 2), (2, 0), (3, 2)]
    assert sorted(second) == [(0, 1), (1, 3), (2, 1)]


def nic_bytes(spec: str, algo: str, system: str | None) -> np.ndarray:
    """Bytes each GPU -> NIC link carried during one 1 GiB all-reduce."""
    graph = parse_spec(spec)
    if system:
        graph.graph[nccl.NCCL] = nccl.NcclConfig(system=system)
    env = simpy.Environment()
    network = Network(env, graph)
    env.run(until=env.process(run_collective(network, "all_reduce", algo, range(32), None, GiB)))
    link_bytes, _, _ = network.ledger.link_totals()
    names = network.link_names
    return np.array([b for name, b in zip(names, link_bytes) if name.startswith("gpu") and "->nic" in name])


def test_ring_per_rail_loads_every_nic_equally_where_the_flat_ring_loads_one():
    per_rail = nic_bytes(A100_4NODES, "nccl_ring", "A100")
    assert len(per_rail) == 32 and per_rail.min() > 0
    assert per_rail.max() == pytest.approx(per_rail.min(), rel=1e-9)
    flat = nic_bytes(A100_4NODES, "ring", None)
    assert np.count_nonzero(flat) == 4  # one NIC per node: the GPU whose ring neighbour is on the next node


def test_nvls_chunk_is_calccollchunkings():
    # enqueue.cc calcCollChunking, NVLS, 16 channels x 8 heads = 128 operations: 128 KiB, cut to 64 KiB
    # below 64 x 128 x 128 KiB = 1 GiB, to 32 KiB below 8 x 128 x 64 KiB = 64 MiB, to 16 KiB below 2 x 128 x 32 KiB
    assert [nccl_tuning.nvls_chunk_bytes(s, 16, 8) for s in (GiB, GiB - 1, 64 * 2**20 - 1, 8 * 2**20 - 1)] == [
        131072,
        65536,
        32768,
        16384,
    ]


@pytest.mark.parametrize(
    ("nbytes", "fill_bytes"),
    [
        # 8 GiB: 128 KiB chunks; the fill is two loops of 8 heads x 128 KiB on one of 16 channels
        (8 * GiB, 2 * 8 * 2**17 * 16),
        # 1 MiB: one partial loop (1 MiB / 16 per channel) crosses three stages, three times its steady time
        (2**20, 2 * 2**20),
    ],
)
def test_nvls_all_reduce_is_the_port_load_closed_form_plus_its_pipeline_fill(nbytes, fill_bytes):
    # each GPU link carries M (1 + 1/G) per direction at NCCL's NVLink rate x nvlsEfficiency, B = 12 channels x
    # 30 GB/s x 0.85, after tuning.cc's 25 us of NVLS latency and the pipeline's fill: two loop-times of the
    # channel's share of that rate (all_reduce.h: scatter, reduce and gather warps in turn)
    graph = parse_spec("dgx:1")
    graph.graph[nccl.NCCL] = nccl.NcclConfig(system="H100")
    seconds, _ = time_collective(graph, "all_reduce", "nvls", None, nbytes)
    link_Bps = 12 * 30e9 * 0.85
    assert seconds == pytest.approx(25e-6 + (nbytes + fill_bytes) * (1 + 1 / 8) / link_Bps, rel=1e-9)
    assert resolve_protocol(graph, "all_reduce", "auto", range(8), 8 * GiB) == ("nvls", "Simple")


def test_nvls_tree_runs_at_nccls_per_channel_cap_and_its_medium_size_correction():
    # two H100 nodes: tuning.cc's perChMaxNVLSTreeBws (Hopper, 2 nodes) 57.7 GB/s per channel x 8 channels is
    # NCCL's busbw; as algorithm bandwidth x nRanks / nsteps = 16 / 30. Below the NVLink flows' own rate
    # (12 x 30 GB/s x 0.85 / (1 + 1/8) = 272 GB/s) and the NICs' (M/8 each at 45 GB/s: 360 GB/s), so it sets the time
    h100_2 = shape(2, "hopper", 18, 50)
    cap_Bps = 8 * 57.7 * 16 / 30 * 1e9
    assert nccl_tuning.nvls_tree_cap_GBps(h100_2) * 1e9 == pytest.approx(cap_Bps)
    assert nccl_tuning.nvls_tree_cap_GBps(shape(4, "hopper", 18, 50)) == pytest.approx(8 * 45.5 * 32 / 62)
    # treeCorrectionFactor (Simple) on the NVLS-tree's rate up to 512 MiB (log2i(nbytes >> 6) < 24), as NCCL
    # >= 2.29.2 applies it on Blackwell; NCCL's choice on Hopper leaves it out, so tree_correction does too
    assert nccl_tuning.run_correction("nvls_tree", "Simple", "all_reduce", 256 * 2**20) == 0.9
    assert nccl_tuning.run_correction("nvls_tree", "Simple", "all_reduce", 64 * 2**20) == 0.8
    assert nccl_tuning.run_correction("nvls_tree", "Simple", "all_reduce", GiB) == 1.0
    assert nccl_tuning.tree_correction("nvls_tree", "Simple", "all_reduce", 256 * 2**20) == 1.0
    assert nccl_tuning.run_correction("tree", "LL", "all_reduce", 8 * 2**10) == 0.7
    graph = parse_spec("fattree:nodes=2,gpus_per_node=8")
    graph.graph[nccl.NCCL] = nccl.NcclConfig(system="H100")
    big, _ = time_collective(graph, "all_reduce", "nvls_tree", None, 8 * GiB)
    mid, _ = time_collective(graph, "all_reduce", "nvls_tree", None, 256 * 2**20)
    # the fixed latency is the same for both sizes; the bytes go at the cap, 256 MiB's slowed by 1 / 0.9
    assert big - mid == pytest.approx((8 * GiB - 256 * 2**20 / 0.9) / cap_Bps, rel=1e-9)


def test_tree_ll_pays_its_first_trip_through_every_hop():
    # four H100 nodes: 2 x 7 NVLink + 2 x 2 network steps; a channel's first trip is 512 threads x 8 bytes
    # (prims_ll.h); a channel's tree LL rate min(45 x 0.92, perChMaxTreeBw 36.0) / 3.8 (tuning.cc); an 8 KiB
    # call runs on 2 channels (enqueue.cc: 4 KiB each), so its trip is the whole 4 KiB
    h100_4 = shape(4, "hopper", 18, 50)
    fill_us = (18 - 1) * 4096 / (36.0 / 3.8 * 1e3)
    assert nccl_tuning.tree_ll_fill_us(h100_4, 8192, 2) == pytest.approx(fill_us)
    assert nccl_tuning.tree_ll_fill_us(h100_4, 1024, 1) == pytest.approx(fill_us / 4)  # a 1 KiB trip
    config = nccl.NcclConfig(system="H100")
    tuned = nccl.tune("all_reduce", "nccl_tree", config, h100_4, 8192, 50e9, tuple(range(8)) * 4)
    assert tuned.protocol == "LL" and tuned.fill_s == pytest.approx(fill_us * 1e-6)
    assert nccl.tune("all_reduce", "nccl_tree", config, h100_4, 2**20, 50e9, tuple(range(8)) * 4).fill_s == 0.0


def test_protocol_override_and_layer_off(capsys):
    assert (
        main(
            [
                "collective",
                "all_reduce",
                "--topology",
                "dgx:1",
                "--sizes",
                "8KiB",
                "--protocol",
                "Simple",
                "--no-nvls",
                "--csv",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("op,algo,protocol") and ",nccl_ring,Simple," in out[1]
    assert main(["collective", "all_reduce", "--topology", "dgx:1", "--sizes", "8KiB", "--nccl", "off", "--json"]) == 0
    assert '"protocol": "-"' in capsys.readouterr().out


def test_bad_protocol_is_a_one_line_error(capsys):
    assert main(["collective", "all_reduce", "--topology", "dgx:1", "--sizes", "8KiB", "--protocol", "LL256"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--protocol: unknown protocol 'LL256'" in err and len(err.splitlines()) == 1


RUN = """
name: nccl_run
cluster:
  gpu: H100-SXM
  nodes: {nodes}
  gpus_per_node: {per}
  topology: {{kind: fattree, link_latency: 1us}}
  {nccl}
model: {{layers: 8, hidden: 512, heads: 8, ffn: 2048, seq_len: 256, vocab: 1000{moe}}}
training: {{global_batch: {batch}, micro_batch: 1, dtype: bf16}}
parallel: {{tp: {tp}, pp: {pp}, dp: {dp}, zero: 1, bucket: 4MB{ep}}}
schedule: 1f1b
numerics: {{enabled: false}}
"""


@pytest.mark.parametrize(
    "shape",
    [
        dict(nodes=4, per=8, tp=8, pp=1, dp=4, batch=8, moe="", ep=""),
        dict(nodes=4, per=4, tp=2, pp=2, dp=4, batch=8, moe="", ep=""),
        dict(nodes=2, per=8, tp=2, pp=1, dp=8, batch=8, moe=", moe: {experts: 8, top_k: 2}", ep=", ep: 8"),
    ],
    ids=["tp8-dp4", "tp2-pp2-dp4", "moe-ep8"],
)
def test_training_runs_use_the_layer_and_symmetry_still_agrees(shape):
    """TP, DP/ZeRO and EP collectives run through the layer (the step changes when it is on), and
    walking representatives gives the exact path's step time and link bytes, as without it."""
    from clustersim.sim.run import simulate
    from clustersim.sim.scenario.loader import load_scenario_text

    on = load_scenario_text(RUN.format(nccl="nccl: {pxn: true}", **shape), "on.yaml")
    off = load_scenario_text(RUN.format(nccl="", **shape), "off.yaml")
    fast, exact = simulate(on), simulate(on, exact=True)
    assert fast.summary["step_time_s"] == pytest.approx(exact.summary["step_time_s"], rel=1e-9)
    np.testing.assert_allclose(fast.log.links.bytes, exact.log.links.bytes, rtol=1e-9, atol=1e-3)
    assert fast.summary["step_time_s"] != pytest.approx(simulate(off).summary["step_time_s"], rel=1e-6)


def test_scenario_nccl_needs_nvswitch_nodes_and_a_known_gpu():
    from clustersim.sim.scenario.loader import load_scenario_text
    from clustersim.sim.scenario.schema import ScenarioError

    text = RUN.format(nodes=1, per=8, tp=8, pp=1, dp=1, batch=1, moe="", ep="", nccl="nccl: {}")
    with pytest.raises(ScenarioError, match="cluster.nccl.*dgx or fattree"):
        load_scenario_text(text.replace("kind: fattree", "kind: switch, link_bandwidth: 450GB/s"), "s.yaml")
    with pytest.raises(ScenarioError, match="cluster.nccl.protocol.*LL256"):
        load_scenario_text(text.replace("nccl: {}", "nccl: {protocol: LL256}"), "s.yaml")


def link_bytes(spec: str, op: str, algo: str, config: nccl.NcclConfig | None, n: int) -> dict[str, float]:
    """Bytes per link during one 1 GiB collective over GPUs 0..n-1."""
    graph = parse_spec(spec)
    if config is not None:
        graph.graph[nccl.NCCL] = config
    env = simpy.Environment()
    network = Network(env, graph)
    env.run(until=env.process(run_collective(network, op, algo, range(n), None, GiB)))
    return dict(zip(network.link_names, network.ledger.link_totals()[0]))


def test_pxn_keeps_inter_node_traffic_on_its_rail():
    """With PXN every inter-node byte stays on a rail's leaf (no spine); without it the ring's
    hop from GPU c-1 of one node to GPU c of the next crosses rails through the spines."""
    spine = lambda loads: sum(b for name, b in loads.items() if "spine" in name)  # noqa: E731
    on = link_bytes(A100_4NODES, "all_reduce", "nccl_ring", nccl.NcclConfig("A100", pxn=True), 32)
    off = link_bytes(A100_4NODES, "all_reduce", "nccl_ring", nccl.NcclConfig("A100", pxn=False), 32)
    assert spine(on) == 0 and spine(off) > 0
    a2a = link_bytes(A100_4NODES, "all_to_all", "pxn", nccl.NcclConfig("A100", pxn=True), 32)
    assert spine(a2a) == 0


@pytest.mark.parametrize(
    ("spec", "system", "busbw_Bps"),
    [
        # A100: NCCL's search runs 12 x 20 = 240 GB/s, above the ~230 GB/s S. Jeaugey gives for the
        # A100's SMs (nccl-tests#149), so 230 holds
        ("dgx:1,nvlink_bandwidth_Bps=300e9", "A100", 230e9),
        # H100: the search's 12 x 30 = 360 GB/s is below the 370 GB/s of nccl-tests#212, so 360 holds
        ("dgx:1", "H100", 360e9),
    ],
)
def test_sm_copies_reach_the_lower_of_nccls_search_and_the_measured_sm_ceiling(spec, system, busbw_Bps):
    graph = parse_spec(spec)
    graph.graph[nccl.NCCL] = nccl.NcclConfig(system)
    seconds, _ = time_collective(graph, "all_gather", "nccl_ring", None, 8 * GiB)
    assert 8 * GiB / seconds * 7 / 8 == pytest.approx(busbw_Bps, rel=0.01)


def test_copy_engine_moves_all_gather_at_line_rate():
    # 8 H100 on one NVSwitch, ring all_gather: busbw = link rate (450 GB/s by copy engine, NCCL's
    # 12 x 30 = 360 GB/s by SM copies), less the per-step latency, small at 8 GiB
    busbw = {}
    for copy_engine in (False, True):
        graph = parse_spec("dgx:1")  # a fresh graph: the layer's settings are read once per graph
        graph.graph[nccl.NCCL] = nccl.NcclConfig("H100", copy_engine=copy_engine)
        seconds, _ = time_collective(graph, "all_gather", "nccl_ring", None, 8 * GiB)
        busbw[copy_engine] = 8 * GiB / seconds * 7 / 8
    assert busbw[False] == pytest.approx(360e9, rel=0.01)
    assert busbw[True] == pytest.approx(450e9, rel=0.01)


def test_pxn_relays_through_the_group_member_on_the_destination_rail():
    """Group [0, 1, 8, 9] on 2 nodes x 8: GPU 0 -> GPU 9 leaves through GPU 1's NIC (rail 1),
    reached over NVLink, so no byte crosses a spine; GPU 0's own NIC carries only rail-0 pieces."""
    graph = parse_spec("fattree:nodes=2,gpus_per_node=8")
    graph.graph[nccl.NCCL] = nccl.NcclConfig("H100")
    env = simpy.Environment()
    network = Network(env, graph)
    env.run(until=env.process(run_collective(network, "all_to_all", "pxn", [0, 1, 8, 9], None, GiB)))
    loads = dict(zip(network.link_names, network.ledger.link_totals()[0]))
    assert sum(b for name, b in loads.items() if "spine" in name) == 0
    # each GPU sends GiB / 4 to each of the 2 peers on the other node, on the wire x 50 / 48 (the
    # NDR NIC's rate over the 48 GB/s channel speed NCCL's search gives 2 NICs per node): one piece
    # per NIC from its own GPU, one relayed
    piece = GiB / 4 * 50 / 48
    assert loads["gpu0->nic0"] == pytest.approx(2 * piece) and loads["gpu1->nic1"] == pytest.approx(2 * piece)


def test_pipeline_sends_cross_rails_through_pxn():
    """A send GPU 0 -> GPU 9 (node 1, rail 1) with the layer on: NVLink to GPU 1, then rail 1's
    NICs; at NCCL's rates (Simple: x 450/360 on NVLink, x 50/45 on the NIC: 8 NICs x 45 GB/s fit
    the 370.8 GB/s of NVLink); without the layer one flow through the spines."""
    from clustersim.sim.collectives.nccl_p2p import wire

    graph = parse_spec("fattree:nodes=2,gpus_per_node=8")
    assert wire(graph, [0], [9], GiB) is None
    graph = parse_spec("fattree:nodes=2,gpus_per_node=8")
    graph.graph[nccl.NCCL] = nccl.NcclConfig("H100")
    src, dst, nbytes = wire(graph, [0, 2], [9, 3], GiB)
    assert [(int(a), int(b)) for a, b in zip(src, dst)] == [(2, 3), (0, 1), (1, 9)]
    assert nbytes == pytest.approx([GiB * 450 / 360, GiB * 450 / 360, GiB * 50 / 45])
