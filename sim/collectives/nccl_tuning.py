"""NCCL's own cost model and choice of algorithm and protocol, ported from its source.

Constants come from NVIDIA/nccl (read at commit 5067397, June 2026):
- src/graph/tuning.cc: `ncclTunerConstantsDefaults` (base latencies per algorithm and protocol,
  hardware latencies per link type NVLINK / PCI / NET, llMaxBws, perChMax* caps), `nvlsEfficiency`,
  and `ncclTopoTuneModel`, whose arithmetic `model` below follows line by line for the algorithms
  we build (ring, tree, NVLS, NVLS-tree; CollNet and PAT are not modelled);
- src/graph/topo.h: the bandwidth NCCL assigns one NVLink (SM80_NVLINK_BW 20 GB/s, SM90 20.6);
- src/graph/search.cc: the speeds its ring search tries (`speedArrayIntra/Inter`, sm90 variants)
  and `ncclTopoDupChannels` (channels doubled while each keeps >= 25 GB/s).
Those are the latest release's; an older one's ring constants come from nccl_versions (Shape.version).

NCCL picks, per call, the (algorithm, protocol) of least predicted time = latency + size / bw
(src/enqueue.cc, topoGetAlgoInfo), with ncclTopoGetAlgoTime's two refinements (`algo_time_us`): the
tree's bandwidth x a size correction, the multi-node Simple ring's latency x 1.4; `choose` does the
same over the enabled ones. Latencies are in microseconds and bandwidths in GB/s inside this module,
as in NCCL; callers get seconds and B/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clustersim.sim.collectives import nccl_versions

PROTOCOLS = ("LL", "LL128", "Simple")
ARCHS = ("volta", "ampere", "hopper", "blackwell")  # NCCL's compCapIndex order

# tuning.cc baseLatencies (us), per algorithm, per protocol (LL, LL128, Simple)
BASE_LATENCY_us = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0)}
# tuning.cc hwLatencies (us): link type -> algorithm -> protocol
HW_LATENCY_us = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0, 0, 25), "nvls_tree": (0, 0, 25)},
    "net": {"tree": (5.0, 8.5, 14), "ring": (2.7, 4.0, 14.0), "nvls": (0, 0, 18), "nvls_tree": (0, 0, 20.9)},
}
# tuning.cc tables indexed [arch][min(nNodes, 3) - 1]
LL_MAX_BW = {"single": (39.0, 87.7, 141.0, 282.0), "intel": (39.0, 39.0, 20.4), "amd": (87.7, 22.5, 19.0)}
PER_CH_MAX_RING_LL128 = ((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, (40.0,) * 3)
PER_CH_MAX_TREE_LL128 = ((20.0,) * 3, (20.0,) * 3, (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
PER_CH_MAX_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
PER_CH_MAX_NVLS_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5), (0.0, 96.0, 80.0))
NVLS_EFFICIENCY = (0.0, 0.0, 0.85, 0.74)
NET_OVERHEAD_us = 1.0  # getNetOverhead on Intel x86 (and the default); tripled for Simple
# topo.h: GB/s NCCL gives one NVLink of a GPU of this generation
NVLINK_GBps = {"volta": 20.0, "ampere": 20.0, "hopper": 20.6, "blackwell": 40.1}
# search.cc: speeds (GB/s per channel) the ring search tries, fastest first
SPEEDS_INTRA = {"sm80": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
                "sm90": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)}  # fmt: skip
SPEEDS_INTER = {"sm80": (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
                "sm90": (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0)}  # fmt: skip
MAX_CHANNELS = 32  # src/include/device.h MAXCHANNELS (the search's maxChannels is at most this)
# src/include/device.h NCCL_*_MAX_NTHREADS and comm.h NCCL_*_THREAD_THRESHOLD: threads per channel
# and bytes per thread below which enqueue.cc gives a call fewer channels
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
# tuning.cc treeCorrectionFactor: a tree all-reduce's bandwidth x this for nbytes >> 6 in [2^i, 2^(i+1))
# ("Trees are not perfectly sticking to the model for medium sizes"), per protocol
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}  # fmt: skip
# tuning.cc ncclTopoGetAlgoTime: "Plateau effect of ring", 1.9 before sm80 and 1.4 from it on, per ARCHS
RING_PLATEAU = {"volta": 1.9, "ampere": 1.4, "hopper": 1.4, "blackwell": 1.4}
# src/transport/nvls.cc: NVLS's channels (NVLS_NCHANNELS_SM90; SM100_NVL on one node) and its largest
# chunk (NCCL_NVLS_CHUNKSIZE's default)
NVLS_CHANNELS = {"hopper": 16, "blackwell": 24}
NVLS_CHUNK_BYTES = 128 * 1024
# src/device/prims_ll.h: each of a channel's NCCL_LL_MAX_NTHREADS (512) threads moves one line of 8 data
# bytes per trip (`offset += nthreads`) and forwards it as soon as its flag says it has landed
LL_TRIP_BYTES = 512 * 8


@dataclass(frozen=True)
class Graph:
    """What NCCL's topology search settles on for one algorithm: channels and GB/s per channel."""

    channels: int
    bw_intra_GBps: float
    bw_inter_GBps: float


@dataclass(frozen=True)
class Shape:
    """The communicator as the model sees it: ranks, nodes, GPU generation, links."""

    ranks: int
    nodes: int
    arch: str  # one of ARCHS
    nvlinks: int  # NVLinks per GPU to the NVSwitch
    nic_GBps: float  # one NIC's rate (0 on a single node)
    nics: int  # NICs per node
    nvls: bool  # NVLink SHARP on the NVSwitch (H100 generation and later)
    version: tuple[int, int, int] = nccl_versions.LATEST_RELEASE  # the NCCL release (its ring constants)


def _speeds(shape: Shape, table: dict) -> tuple[float, ...]:
    return table["sm90" if ARCHS.index(shape.arch) >= 2 else "sm80"]


def ring_graph(shape: Shape) -> Graph:
    """Channels and per-channel speed of NCCL's ring search on an NVSwitch node (+ one NIC per rail).

    One node: the fastest speed s of the search with floor(nvlink_total / s) >= 1 channels.
    Several nodes: one channel per NIC, at the fastest speed s <= the NIC's rate with NICs x s
    within the node's NVLink total. Then ncclTopoDupChannels doubles the channels (halving s)
    while s >= 25 GB/s (on sm90 only if s >= 50 or channels <= 4)."""
    total = shape.nvlinks * NVLINK_GBps[shape.arch]
    if shape.nodes == 1:
        speed = next((s for s in _speeds(shape, SPEEDS_INTRA) if s <= total), _speeds(shape, SPEEDS_INTRA)[-1])
        channels = max(1, min(MAX_CHANNELS // 2, int(total // speed)))
    else:
        fits = [s for s in _speeds(shape, SPEEDS_INTER) if s <= shape.nic_GBps and shape.nics * s <= total]
        speed, channels = (fits[0] if fits else _speeds(shape, SPEEDS_INTER)[-1]), shape.nics
    if speed >= 25.0 and not (ARCHS.index(shape.arch) >= 2 and speed < 50.0 and channels > 4):
        doubled = min(2 * channels, MAX_CHANNELS)
        speed, channels = speed / math.ceil(doubled / channels), doubled
    return Graph(channels, speed, speed)


def channels_used(algo: str, proto: str, shape: Shape, nbytes: float) -> tuple[int, int]:
    """(channels this call runs on, channels of the graph): enqueue.cc drops channels while
    nbytes < channels x threads x threshold (ring LL's threshold x ranks); NVLS keeps them all."""
    total = ring_graph(shape).channels
    if algo.startswith("nvls"):
        return total, total
    threshold = THREAD_THRESHOLD[proto] * (shape.ranks if (algo, proto) == ("ring", "LL") else 1)
    used = total
    while used >= 2 and nbytes < used * MAX_THREADS[proto] * threshold:
        used -= 1
    return used, total


def nvls_chunk_bytes(nbytes: float, channels: int, heads: int) -> int:
    """The chunk of a single-node NVLS call (enqueue.cc calcCollChunking): 128 KiB, cut to 64, 32 and
    16 KiB when the call has fewer than 64, 8 and 2 chunks for each of its channels x heads operations."""
    chunk, operations = NVLS_CHUNK_BYTES, channels * heads
    for chunks, smaller in ((64, 65536), (8, 32768), (2, 16384)):
        if nbytes < chunks * operations * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def nvls_tree_cap_GBps(shape: Shape) -> float:
    """The algorithm bandwidth NCCL's NVLS-tree reaches at most: its channels x tuning.cc's
    perChMaxNVLSTreeBws (what NVIDIA measures one NVLS-tree channel to carry, by node count: 57.7
    GB/s on two H100 nodes, 45.5 on more), as bus bandwidth converted by nRanks / nsteps."""
    a, index2 = ARCHS.index(shape.arch), min(shape.nodes, 3) - 1
    bus = ring_graph(shape).channels * PER_CH_MAX_NVLS_TREE[a][index2]
    return bus * shape.ranks / steps_of("all_reduce", shape.ranks)


def tree_ll_fill_us(shape: Shape, nbytes: float, channels: int) -> float:
    """What a tree LL all-reduce takes beyond latency + bytes / rate: a channel's first trip (one line
    per thread, LL_TRIP_BYTES) crosses every hop in turn, 2 (ppn - 1) NVLink and 2 log2(nodes) network
    steps of the chain up and down, before the root's sum is back, each at a channel's tree LL rate
    (tuning.cc: the search's speed x 0.92 within perChMaxTreeBw, / 3.8), and the steady pipeline pays one
    of those. NCCL's newer cost model writes the same first-chunk term for trees (src/tuning/
    pipeline_model: T_first over the tree's steps); its Hopper tuning.cc has no such term. LL128's and
    Simple's trips (20 warps x 1920 bytes, 512 KiB slices) would give theirs; they are left out
    (docs/calibration.md: the runs do not bear out a trip of that size)."""
    a, index2 = ARCHS.index(shape.arch), min(shape.nodes, 3) - 1
    speed = ring_graph(shape).bw_inter_GBps if shape.nodes > 2 else ring_graph(shape).bw_intra_GBps
    rate_GBps = min(speed * 0.92, PER_CH_MAX_TREE[a][index2]) / 3.8
    steps = 2 * (shape.ranks // shape.nodes - 1) + 2 * int(math.log2(shape.nodes))
    return max(steps - 1, 0) * min(LL_TRIP_BYTES, nbytes / channels) / (rate_GBps * 1e3)


def steps_of(op: str, ranks: int) -> int:
    """nsteps of ncclTopoTuneModel: 2(n-1) for all_reduce, n-1 for reduce_scatter / all_gather, n else."""
    return 2 * (ranks - 1) if op == "all_reduce" else ranks - 1 if op in ("reduce_scatter", "all_gather") else ranks


def model(op: str, algo: str, proto: str, shape: Shape) -> tuple[float, float]:
    """(latency us, algorithm bandwidth GB/s) NCCL predicts; bandwidth 0 where NCCL would not run it."""
    p, a = PROTOCOLS.index(proto), ARCHS.index(shape.arch)
    nodes, ranks, ppn = shape.nodes, shape.ranks, shape.ranks / shape.nodes
    graph, index2 = ring_graph(shape), min(nodes, 3) - 1
    if algo.startswith("nvls") and (not shape.nvls or proto != "Simple" or op != "all_reduce"):
        return math.inf, 0.0
    if algo.startswith("nvls") and (algo == "nvls") != (nodes == 1):  # NVLS alone needs CollNet off-node
        return math.inf, 0.0
    if algo == "tree" and op != "all_reduce":
        return math.inf, 0.0
    bw = graph.bw_intra_GBps if nodes <= 2 else graph.bw_inter_GBps
    if algo.startswith("nvls"):
        intra = graph.bw_intra_GBps * NVLS_EFFICIENCY[a] * (graph.channels - 1) / graph.channels * 2.0
        inter = graph.bw_inter_GBps * (2 if nodes <= 2 and algo == "nvls_tree" else 1) if nodes > 1 else math.inf
        cap = PER_CH_MAX_NVLS_TREE[a][index2] if algo == "nvls_tree" else math.inf
        bw = min(intra, inter, cap)
    bus = graph.channels * bw
    ring = nccl_versions.ring_constants(shape.version)
    if algo == "ring" and shape.arch == "ampere":
        bus = min(bus, ring.ampere_bus_cap_GBps)
    ll_max = LL_MAX_BW["single"][a] if nodes == 1 else LL_MAX_BW["intel"][index2]
    if algo == "ring" and proto == "LL":
        one_node_gather = nodes == 1 and op in ("all_gather", "reduce_scatter")
        bus = min(ll_max, bus * (ring.ll_factor_other if one_node_gather else ring.ll_factor_all_reduce))
    if algo == "ring" and proto == "LL128":
        older = ring.ampere_ll128_per_channel_GBps.get(op) if shape.arch == "ampere" else None
        bus = min(bus * 0.92, graph.channels * (older or PER_CH_MAX_RING_LL128[a][index2]))
    if algo == "tree":
        bus = min(bus * 0.92, graph.channels * PER_CH_MAX_TREE[a][index2])
        if proto == "LL":
            bus = min(bus / 3.8, ll_max)
        if proto == "LL128":
            bus = min(
                bus * (7.0 / 9.0 if nodes == 1 else 120.0 / 128.0), graph.channels * PER_CH_MAX_TREE_LL128[a][index2]
            )
    nsteps = steps_of(op, ranks)
    algbw = bus * (ranks / max(nsteps, 1) if algo != "tree" else 0.5)  # one rank: nothing moves
    return _latency(op, algo, p, shape, nsteps, ppn), algbw


def base_latency_us(algo: str, p: int, shape: Shape) -> float:
    """tuning.cc baseLat of the algorithm and protocol (index p) in the shape's NCCL release."""
    older = nccl_versions.ring_constants(shape.version).base_latency_us if algo == "ring" else None
    return (older or BASE_LATENCY_us[algo])[p]


def _latency(op: str, algo: str, p: int, shape: Shape, nsteps: int, ppn: float) -> float:
    older = nccl_versions.ring_constants(shape.version).nvlink_hop_us if algo == "ring" else None
    intra_hw = (older or HW_LATENCY_us["nvlink"][algo])[p]
    inter_hw = HW_LATENCY_us["net"]["tree" if ppn == 1 else algo][p]
    latency = base_latency_us(algo, p, shape)
    if algo == "ring":
        hw = intra_hw if shape.nodes == 1 else HW_LATENCY_us["net"]["ring"][p]
        if op in ("broadcast", "reduce"):
            return latency + hw
        overhead = NET_OVERHEAD_us * (3 if PROTOCOLS[p] == "Simple" else 1) if shape.nodes > 1 else 0.0
        intra = max(intra_hw, overhead)
        inter_steps = 0 if shape.nodes == 1 else 2 * (shape.nodes - 1) if op == "all_reduce" else shape.nodes - 1
        return latency + (nsteps - inter_steps) * intra + inter_steps * inter_hw
    log2_nodes = int(math.log2(shape.nodes))
    if algo == "tree":
        return latency + 2 * ((ppn - 1) * intra_hw + log2_nodes * inter_hw)
    if algo == "nvls":
        return intra_hw + (inter_hw if shape.nodes > 1 else 0.0)
    return latency + intra_hw + 2 * log2_nodes * inter_hw  # nvls_tree


def tree_correction(algo: str, proto: str, op: str, nbytes: float) -> float:
    """The factor ncclTopoGetAlgoTime puts on a tree all-reduce's bandwidth at this size (1 elsewhere)."""
    return _correction(algo, proto, op, nbytes) if algo == "tree" else 1.0


def run_correction(algo: str, proto: str, op: str, nbytes: float) -> float:
    """The factor on a call's rate at this size: the tree's (tree_correction), and the same table on an
    NVLS-tree all-reduce up to 512 MiB, as NCCL applies it since v2.29.2 (ncclTopoGetAlgoTime,
    `algorithm == NCCL_ALGO_NVLS_TREE ... logSize < 24`) on Blackwell. On Hopper NCCL leaves it out of its
    choice (so `choose` does too), but its runs fall short of the uncorrected rate by as much: the
    NVLS-tree sweeps of two H100 clusters on 2, 4 and 8 nodes (nccl-tests#309) all reach 86-92% of their
    own 8 GiB rate at 256 MiB (docs/calibration.md)."""
    if algo == "nvls_tree":
        return _correction(algo, proto, op, nbytes)
    return tree_correction(algo, proto, op, nbytes)


def _correction(algo: str, proto: str, op: str, nbytes: float) -> float:
    """treeCorrectionFactor at log2i(nbytes >> 6) for an all-reduce: below index 23 for the tree, 24 for
    the NVLS-tree (as in NCCL's ncclTopoGetAlgoTime); 1 outside the table."""
    log_size = int(nbytes) >> 6
    index = log_size.bit_length() - 1  # log2i(nbytes >> 6); -1 below 64 bytes
    if op != "all_reduce" or not 0 <= index < (23 if algo == "tree" else 24):
        return 1.0
    return TREE_CORRECTION[proto][index]


def ring_plateau(algo: str, proto: str, op: str, shape: Shape, nbytes: float) -> float:
    """The factor ncclTopoGetAlgoTime puts on a multi-node Simple ring all-reduce's latency (1 elsewhere)."""
    channels = ring_graph(shape).channels
    plateau = (algo, proto, op) == ("ring", "Simple", "all_reduce") and shape.nodes > 1
    return RING_PLATEAU[shape.arch] if plateau and nbytes / (channels * shape.ranks) >= 64 else 1.0


def algo_time_us(op: str, algo: str, proto: str, shape: Shape, nbytes: float) -> float:
    """ncclTopoGetAlgoTime for one call: latency + nbytes / bandwidth with both refinements (inf where
    NCCL would not run it)."""
    latency_us, bw_GBps = model(op, algo, proto, shape)
    if bw_GBps <= 0:
        return math.inf
    bw_GBps *= tree_correction(algo, proto, op, nbytes)
    return latency_us * ring_plateau(algo, proto, op, shape, nbytes) + nbytes / (bw_GBps * 1e3)


def choose(op: str, nbytes: float, shape: Shape, algos: tuple[str, ...], protos: tuple[str, ...]) -> tuple[str, str]:
    """NCCL's pick: the enabled (algorithm, protocol) of least `algo_time_us`.
    LL128 is enabled by default only on NVLink/NVSwitch paths (tuning.cc), which ours are."""
    best: tuple[float, str, str] | None = None
    for algo in algos:
        for proto in protos:
            time_us = algo_time_us(op, algo, proto, shape, nbytes)
            if time_us == math.inf:
                continue
            if best is None or time_us < best[0]:
                best = (time_us, algo, proto)
    if best is None:
        raise ValueError(f"NCCL has no algorithm among {algos} with protocols {protos} for {op}")
    return best[1], best[2]
