"""The NCCL layer's settings and what it derives per call: protocol, channels, link rates, latency.

A topology graph that carries `graph.graph[NCCL]` (an `NcclConfig`) runs its collectives as NCCL
does; without it the textbook algorithms run unchanged. Switches (each also a scenario key under
`cluster.nccl` and a `clustersim collective` flag):
- `system`: the GPU generation whose NCCL constants apply (SYSTEMS: A100, H100);
- `protocol`: auto (NCCL's size-based choice, sim.collectives.nccl_tuning.choose) or LL / LL128 / Simple;
- `tree`, `nvls`: whether NCCL may pick its tree all-reduce, and NVLink SHARP (H100 generation);
- `pxn`: inter-node messages leave through the NIC on the destination's rail, reached over NVLink
  (NCCL's PXN, src/transport/net.cc); off, they leave through the sender's own NIC;
- `copy_engine`: intra-node copies of non-reducing collectives by the copy engine at NVLink line
  rate (Simple only), instead of SM-driven copies at NCCL's per-NVLink rate;
- `version`: the NCCL release the run uses (default the latest the layer ports): an older one runs
  the ring at its own tuning.cc constants (sim.collectives.nccl_versions).

How the costs enter the flow network (sim.collectives.nccl_algorithms applies them):
- bytes on an NVLink hop are multiplied by line rate / the rate of NCCL's single-node ring search
  (channels x speed: 12 x 20 = 240 GB/s on A100, 12 x 30 = 360 on H100, from topo.h's 20 and 20.6
  GB/s per NVLink against 25 on the wire): an SM-driven copy reaches NCCL's figure;
- bytes on a NIC hop by NIC rate / the channel speed NCCL's search settles on (search.cc);
- both by Simple bandwidth / the protocol's bandwidth (tuning.cc: LL halves it, LL128 x 0.92),
  by the graph's channels / the call's: a small call runs on fewer channels (enqueue.cc), and for
  a tree or NVLS-tree all-reduce by 1 / tuning.cc's size correction (nccl_tuning.run_correction);
- NVLS-tree's NVLink bytes go no faster than tuning.cc's per-channel cap (nvls_tree_cap_GBps);
- every step takes at least NCCL's per-hop latency of the protocol (tuning.cc hwLatencies, x 1.4
  for a multi-node Simple ring all-reduce, nccl_tuning.ring_plateau; the path latency the network
  charges counts toward it), and the first step NCCL's base latency more;
- single-node NVLS pays its pipeline's fill once (`nvls_fill_s`), a tree LL all-reduce its first trip
  through every hop (nccl_tuning.tree_ll_fill_us); a ring has none (every rank sends from the first
  step on, and each step's data is what the previous one delivered).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from clustersim.sim.collectives import nccl_tuning as tuning
from clustersim.sim.collectives import nccl_versions
from clustersim.sim.collectives.steps import CollectiveError

NCCL = "nccl"  # graph.graph key holding the NcclConfig


@dataclass(frozen=True)
class System:
    """A GPU generation as NCCL sees it."""

    arch: str  # nccl_tuning.ARCHS
    nvlinks: int  # NVLinks per GPU into the NVSwitches
    nvlink_Bps: float  # line rate of them all, one direction (the datasheet figure)
    nvls: bool  # NVSwitch with NVLink SHARP
    sm_nvlink_Bps: float  # the most NCCL's kernels (SM-driven copies) reach over them all, as NVIDIA measures it


SYSTEMS = {
    # A100 datasheet: 12 third-generation NVLinks, 600 GB/s bidirectional. S. Jeaugey (NVIDIA),
    # nccl-tests#149 (2023-07-05): 20 GB/s per NVLink with the SMs' 128-byte payloads makes 240 GB/s,
    # "but some other bottlenecks on the GPUs limits it to ~230GB/s"
    "A100": System("ampere", 12, 300e9, nvls=False, sm_nvlink_Bps=230e9),
    # H100 SXM datasheet: 18 fourth-generation NVLinks, 900 GB/s bidirectional; NVSwitch gen 3 has SHARP.
    # S. Jeaugey, nccl-tests#212 (2024-05-06): "NCCL can get an effective NVLink bandwidth of 370GB/s"
    "H100": System("hopper", 18, 450e9, nvls=True, sm_nvlink_Bps=370e9),
}


# A scenario's cluster.gpu -> the system whose NCCL constants apply (H200: H100's NVLink4 and NVSwitch;
# the 40 GB A100 SXM: the 80 GB one's NVLink3 and NVSwitch, as in the DGX A100 320GB). H800 is left
# out: its NVLink4 has 8 links, not 18, and NCCL's channel counts for it are not in this table.
SYSTEM_OF_GPU = {"A100-SXM-80GB": "A100", "A100-SXM-40GB": "A100", "H100-SXM": "H100", "H200": "H100"}


@dataclass(frozen=True)
class NcclConfig:
    system: str = "H100"
    protocol: str = "auto"
    tree: bool = True
    nvls: bool = True
    pxn: bool = True
    copy_engine: bool = False
    version: str = nccl_versions.LATEST  # the NCCL release the run uses (its ring constants, nccl_versions)

    def __post_init__(self) -> None:
        nccl_versions.parse(self.version)
        if self.system not in SYSTEMS:
            raise ValueError(f"unknown NCCL system {self.system!r} (valid: {', '.join(SYSTEMS)})")
        if self.protocol not in ("auto", *tuning.PROTOCOLS):
            raise ValueError(f"unknown protocol {self.protocol!r} (valid: auto, {', '.join(tuning.PROTOCOLS)})")


def system_for(nvlink_Bps: float | None) -> str | None:
    """The system whose NVLink line rate a DGX-like topology has (None when none matches)."""
    return next((name for name, s in SYSTEMS.items() if nvlink_Bps is not None and s.nvlink_Bps == nvlink_Bps), None)


@dataclass(frozen=True)
class Tuned:
    """One call's NCCL decisions and costs, read by the step generators and the runner."""

    protocol: str
    intra_factor: float  # bytes on an NVLink hop x this
    inter_factor: float  # bytes on a NIC hop x this
    pxn: bool
    rails: tuple[int, ...]  # each rank's GPU's index inside its node (its NIC's rail)
    base_latency_s: float  # once, on the first step
    hop_latency_s: float  # per step, the network's path latency included
    fill_s: float = 0.0  # once: a pipeline's fill beyond its steady rate (single-node NVLS, tree LL)


ALGOS = {"nccl_ring": "ring", "nccl_tree": "tree", "nvls": "nvls", "nvls_tree": "nvls_tree", "pxn": "pxn"}


def shape_of(config: NcclConfig, nodes: int, ranks: int, nic_Bps: float | None, nics: int) -> tuning.Shape:
    system, version = SYSTEMS[config.system], nccl_versions.parse(config.version)
    return tuning.Shape(
        ranks=ranks,
        nodes=nodes,
        arch=system.arch,
        nvlinks=system.nvlinks,
        nic_GBps=(nic_Bps or 0.0) / 1e9,
        nics=nics,
        nvls=system.nvls
        and config.nvls
        and version >= nccl_versions.FIRST_RELEASE["nvls" if nodes == 1 else "nvls_tree"],
        version=version,
    )


def pick(op: str, config: NcclConfig, shape: tuning.Shape, nbytes: float) -> str:
    """The registry name of the algorithm NCCL would run (its tuning model's least time)."""
    if op == "all_to_all":
        return "pxn"
    if op not in ("all_reduce", "reduce_scatter", "all_gather"):
        raise CollectiveError(f"the NCCL layer builds all_reduce, reduce_scatter, all_gather and all_to_all, not {op}")
    algos = ["ring"]
    if op == "all_reduce" and shape.nodes > 1 and config.tree:
        algos.append("tree")
    if op == "all_reduce" and shape.nvls:
        algos.append("nvls" if shape.nodes == 1 else "nvls_tree")
    algo, _ = tuning.choose(op, nbytes, shape, tuple(algos), _protocols(config, op))
    return {"ring": "nccl_ring", "tree": "nccl_tree"}.get(algo, algo)


def _protocols(config: NcclConfig, op: str) -> tuple[str, ...]:
    if config.copy_engine and op == "all_gather":
        return ("Simple",)  # a copy engine moves whole buffers, no LL flags
    return tuning.PROTOCOLS if config.protocol == "auto" else (config.protocol,)


def tune(
    op: str, name: str, config: NcclConfig, shape: tuning.Shape, nbytes: float, nic_Bps: float | None, rails
) -> Tuned:
    """Protocol, rates and latencies for running `op` with the NCCL algorithm `name` on ranks
    whose GPUs sit on `rails` (their index inside their node)."""
    algo = ALGOS[name]
    call = (config, shape, nic_Bps, tuple(rails))
    if algo == "pxn":
        protocol = _p2p_protocol(config, nbytes / max(shape.ranks, 1))
        hop_us = tuning.HW_LATENCY_us["net" if shape.nodes > 1 else "nvlink"]["ring"][tuning.PROTOCOLS.index(protocol)]
        return _tuned(call, "all_gather", "ring", algo, protocol, hop_us, steps=1, slowdown=1.0)
    protos = ("Simple",) if algo.startswith("nvls") else _protocols(config, op)
    try:
        _, protocol = tuning.choose(op, nbytes, shape, (algo,), protos)
    except ValueError:
        raise CollectiveError(
            f"{name} does not run here: NVLS needs one node of an NVLS system (H100), NVLS-tree several; "
            f"{shape.nodes} node(s) of {config.system}"
        ) from None
    latency_us, _ = tuning.model(op, algo, protocol, shape)
    latency_us *= tuning.ring_plateau(algo, protocol, op, shape, nbytes)
    base_us = tuning.base_latency_us(algo, tuning.PROTOCOLS.index(protocol), shape)
    steps = tuning.steps_of(op, shape.ranks) if algo == "ring" else 1
    used, total = tuning.channels_used(algo, protocol, shape, nbytes)
    slower = total / used / tuning.run_correction(algo, protocol, op, nbytes)
    tuned = _tuned(call, op, algo, algo, protocol, latency_us - base_us, steps, slower)
    if algo == "nvls":
        tuned = replace(tuned, fill_s=nvls_fill_s(shape, nbytes, SYSTEMS[config.system].nvlink_Bps, tuned.intra_factor))
    if (algo, protocol) == ("tree", "LL"):
        tuned = replace(tuned, fill_s=tuning.tree_ll_fill_us(shape, nbytes, used) * 1e-6)
    return tuned


def nvls_fill_s(shape: tuning.Shape, nbytes: float, nvlink_Bps: float, intra_factor: float) -> float:
    """Single-node NVLS runs each channel as a three-stage pipeline over loops of heads x chunk bytes
    (src/device/all_reduce.h, RunWorkColl NVLS oneNode: scatter warps copy a loop into the heads'
    buffers, reduce warps multimem-reduce and -store it, gather warps copy it out), so the call ends
    two loop-times after a steady pipeline would: its first loop crosses the two stages ahead of the
    last before that one starts. A loop-time is the loop's bytes at the channel's share of the NVLS
    rate (each GPU link carries M (1 + 1/G) at line rate / intra_factor); a call smaller than one
    loop per channel is one partial loop, three times its steady time."""
    heads = shape.ranks // shape.nodes
    channels = tuning.NVLS_CHANNELS[shape.arch]
    first_loop = min(heads * tuning.nvls_chunk_bytes(nbytes, channels, heads), nbytes / channels)
    channel_Bps = nvlink_Bps / intra_factor / (1 + 1 / heads) / channels
    return 2 * first_loop / channel_Bps


def p2p(config: NcclConfig, shape: tuning.Shape, nbytes: float, nic_Bps: float | None) -> Tuned:
    """Rates and protocol of one send/recv of `nbytes` (a pipeline's activations): NCCL's p2p
    protocol and wire factors, the NVLink and NIC rates of its search (no latency term: tuning.cc
    has none for p2p; the path's latency stands)."""
    protocol = _p2p_protocol(config, nbytes)
    return _tuned((config, shape, nic_Bps, ()), "all_gather", "ring", "pxn", protocol, 0.0, 1, slowdown=1.0)


def _p2p_protocol(config: NcclConfig, peer_bytes: float) -> str:
    """NCCL's send/recv protocol: LL up to NCCL_P2P_LL_THRESHOLD (16 KiB) per peer and channel,
    else Simple (src/enqueue.cc); a configured protocol wins, the copy engine has Simple only."""
    if config.copy_engine:
        return "Simple"
    if config.protocol != "auto":
        return config.protocol
    return "LL" if peer_bytes <= P2P_LL_THRESHOLD_BYTES else "Simple"


P2P_LL_THRESHOLD_BYTES = 16384
# Bytes on the wire per data byte of a send/recv (no collective-level caps apply): an LL line is 8
# bytes of data and 8 of flags (ncclLLFifoLine in src/include/device.h), an LL128 line 120 of 128
P2P_WIRE_FACTOR = {"LL": 2.0, "LL128": 128 / 120, "Simple": 1.0}


def _tuned(call: tuple, model_op, model_algo, algo, protocol, latency_us, steps, slowdown) -> Tuned:
    """The rates of `protocol` on this system against NCCL's Simple (tuning.cc's factors), the
    NVLink and NIC rates of NCCL's ring search slowed by `slowdown` (the graph's channels over the
    call's, enqueue.cc; a tree's size correction, tuning.cc), and `latency_us` spread over `steps`."""
    config, shape, nic_Bps, rails = call
    system = SYSTEMS[config.system]
    _, bw = tuning.model(model_op, model_algo, protocol, shape)
    _, simple_bw = tuning.model(model_op, model_algo, "Simple", shape)
    graph = tuning.ring_graph(shape)
    one_node = tuning.ring_graph(replace(shape, nodes=1, ranks=max(shape.ranks // shape.nodes, 1)))
    # what NCCL's search runs NVLink at, within what the GPU's SMs reach (A100: 230 of the search's 240)
    nccl_nvlink_Bps = min(one_node.channels * one_node.bw_intra_GBps * 1e9, system.sm_nvlink_Bps)
    copy = config.copy_engine and model_op == "all_gather"  # a copy, no reduction: all_gather, all_to_all
    intra = 1.0 if copy else system.nvlink_Bps / nccl_nvlink_Bps
    if algo.startswith("nvls"):
        intra /= tuning.NVLS_EFFICIENCY[tuning.ARCHS.index(system.arch)]
    if algo == "nvls_tree":  # each GPU link carries M (1 + 1/G): no faster than NCCL's per-channel cap allows
        gpus = shape.ranks / shape.nodes
        intra = max(intra, system.nvlink_Bps / (1 + 1 / gpus) / (tuning.nvls_tree_cap_GBps(shape) * 1e9))
    per_nic_Bps = graph.bw_inter_GBps * 1e9 * graph.channels / max(shape.nics, 1)
    inter = (nic_Bps / per_nic_Bps) if (nic_Bps and shape.nodes > 1) else 1.0
    protocol_factor = P2P_WIRE_FACTOR[protocol] if algo == "pxn" else simple_bw / bw if bw > 0 else 1.0
    base_us = tuning.base_latency_us(model_algo, tuning.PROTOCOLS.index(protocol), shape)
    return Tuned(
        protocol=protocol,
        intra_factor=intra * protocol_factor * slowdown,
        inter_factor=inter * protocol_factor * slowdown,
        pxn=config.pxn,
        rails=rails,
        base_latency_s=base_us * 1e-6,
        hop_latency_s=latency_us * 1e-6 / max(1, steps),
    )
