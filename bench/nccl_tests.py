"""clustersim's NCCL layer against published nccl-tests bus bandwidths: docs/calibration.md's
collectives section.

One hardware description per system (link rates from the datasheets, NCCL's constants from its
source through sim.collectives.nccl), never a per-row factor. A row runs the algorithm its source
ran: `auto` (NCCL's own choice) unless the source forced one (NCCL_ALGO=NVLS, NCCL_ALGO=RING), under the
NCCL release it ran where the source names one (`VERSIONS`; a property of the run, like the launch).
Every row states the error it is allowed (`bound`); tests/sim/collectives/test_nccl_calibration.py
reruns the fast rows and checks them against it.

    python bench/nccl_tests.py            # every row, then the full sweeps, as in docs/calibration.md
    python bench/nccl_tests.py --small    # only the rows the test suite reruns

The full sweeps (`SWEEPS`) set every size of the published tables, 1 KiB to 8 GiB, against the
simulation and against NCCL's own cost model (latency + size / bandwidth of the algorithm and
protocol it picks, sim.collectives.nccl_tuning.algo_time_us, which the layer ports): where both miss by
the same amount the gap is outside what NCCL's source says about itself.

Longer than 300 lines: most of it is the published figures (rows, sweeps and their sources), kept
next to the code that reruns them so a row and its simulation are read together.
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass

from clustersim.sim.collectives import nccl_tuning
from clustersim.sim.collectives.fabric import describe
from clustersim.sim.collectives.nccl import ALGOS, NCCL, NcclConfig
from clustersim.sim.collectives.nccl_table import BUSBW_FACTOR
from clustersim.sim.collectives.nccl_versions import LATEST
from clustersim.sim.collectives.registry import nccl_shape
from clustersim.sim.collectives.run import resolve_protocol, time_collective
from clustersim.sim.scenario.spec import parse_spec
from clustersim.topologies.schema import gpu_nodes

K, M, G = 2**10, 2**20, 2**30

# The systems: (topology spec, NCCL system). DGX A100: 12 NVLink3 = 300 GB/s per direction, 8 HDR
# NICs of 200 Gb/s = 25 GB/s; DGX H100: 18 NVLink4 = 450 GB/s (the dgx default), 8 ConnectX-7 NDR
# of 400 Gb/s = 50 GB/s (the default NIC).
SYSTEMS = {
    "DGX A100": ("dgx:1,nvlink_bandwidth_Bps=300e9", "A100"),
    "DGX H100": ("dgx:1", "H100"),
    "4 DGX A100, 8 HDR rails": (
        "fattree:nodes=4,gpus_per_node=8,nvlink_bandwidth_Bps=300e9,nic_bandwidth_Bps=25e9",
        "A100",
    ),
    "2 DGX A100, 8 HDR rails": (
        "fattree:nodes=2,gpus_per_node=8,nvlink_bandwidth_Bps=300e9,nic_bandwidth_Bps=25e9",
        "A100",
    ),
    "6 DGX H100, 8 NDR rails": ("fattree:nodes=6,gpus_per_node=8", "H100"),
    "4 DGX H100, 8 NDR rails": ("fattree:nodes=4,gpus_per_node=8", "H100"),
    "2 DGX H100, 8 NDR rails": ("fattree:nodes=2,gpus_per_node=8", "H100"),
    "8 DGX H100, 8 NDR rails": ("fattree:nodes=8,gpus_per_node=8", "H100"),
}

AZURE_A100 = (
    "Azure/AI-benchmarking-guide, https://github.com/Azure/AI-benchmarking-guide/blob/main/Azure_Results/"
    "ND_A100_v4_results.md, table 'NCCL Bandwidth' (the page names NCCL 2.18.5; run with NCCL_ALGO=NVLS, an A100 "
    "all-reduce needs NCCL 2.19 or later, whose ring backup it then ran; install_requirements.sh builds NCCL's "
    "master, v2.22.3 or v2.23.4 when the page came in, 2024-09-25)"
)
AZURE_H100 = (
    "Azure/AI-benchmarking-guide, https://github.com/Azure/AI-benchmarking-guide/blob/main/Azure%20Results/"
    "ND_H100_v5_results.md, table 'NCCL Bandwidth' (NCCL 2.18.5)"
)
NVLS_RUN = "NCCL_ALGO=NVLS all_reduce_perf -g 8 (Benchmarks/NVIDIA/NCCLBandwidth.py)"
JEAUGEY_212 = "NVIDIA/nccl-tests#212 (https://github.com/NVIDIA/nccl-tests/issues/212), S. Jeaugey (NVIDIA), 2024-05-06"
JEAUGEY_160 = (
    "NVIDIA/nccl-tests#160 (https://github.com/NVIDIA/nccl-tests/issues/160), S. Jeaugey (NVIDIA), 2023: "
    "a ring reaches ~24 GB/s per HDR NIC"
)
ISSUE_1281 = "NVIDIA/nccl#1281 (https://github.com/NVIDIA/nccl/issues/1281, 2024-05-10), nccl-tests on H100"
ISSUE_267 = (
    "NVIDIA/nccl-tests#267 (https://github.com/NVIDIA/nccl-tests/issues/267), S. Jeaugey and AddyLaddy: "
    "alltoall gets one NIC's rate, 48-49 GB/s on NDR"
)
ISSUE_309 = "NVIDIA/nccl-tests#309 (https://github.com/NVIDIA/nccl-tests/issues/309), 2025"
QOOFYK_4 = (
    ISSUE_309 + ": qoofyk, 4 VMs of Dell XE9680 (8 H100 SXM, 8 ConnectX-7 NDR each), NCCL 2.26.2, mpirun -np 32 "
    "all_reduce_perf -b 8 -e 16g -f 2 -g 1 (one process per GPU), NCCL_NET_GDR_LEVEL=1, out-of-place; "
    "K. Iskra (NVIDIA): 'a good number'"
)
QOOFYK_2 = ISSUE_309 + ": qoofyk, 2 Dell XE9680 (bare metal), NCCL 2.26.2, mpirun -np 16 -g 1, out-of-place"
OCI_A100 = (
    "oracle-japan/ocitutorials, tutorials/_intermediates/spinup-gpu-cluster.md section 4-2 (OCI BM.GPU4.8: 8 "
    "A100-SXM4-40GB on NVSwitch), all_reduce_perf -b 64 -e 10G -f 2 -t 1 -g 8 in horovod/horovod:latest (CUDA 11.3), "
    "nccl-tests built on the image's NCCL (NCCL_HOME=/usr/lib/x86_64-linux-gnu): 2.9.9 (horovod/horovod "
    "docker/horovod/Dockerfile, NCCL_VERSION=2.9.9-1+cuda11.3 with CUDA 11.3.1 from 2022-10-10 on; the tutorial's "
    "later version replaces it by libnccl2 2.15.5), out-of-place"
)
SUPERBENCH_A100 = (
    "microsoft/superbenchmark, tests/benchmarks/micro_benchmarks/test_cuda_nccl_bw_performance.py, raw nccl-tests "
    "output of host sb-validation-scus-000001 (8 A100-SXM4-40GB), all_reduce_perf / all_gather_perf / "
    "reduce_scatter_perf -b 1 -e 8G -f 2 -g 8 -c 0, out-of-place; NCCL not printed: the test data came in "
    "2021-07-26 (e083a598), when superbenchmark's image (dockerfile/cuda11.1.1.dockerfile) built NCCL's "
    "bootstrap_tag branch (v2.8.4-1 before 2021-06-16, v2.10.3-1 from 2022-02), taken as 2.9.9, the release "
    "before it (2.8.4 has the same ring constants)"
)
OCI_A100_G1 = (
    "oracle-japan/ocitutorials, content/hpc/tech-knowhow/container-with-singularity/index.md section 6-2-5 (OCI "
    "BM.GPU4.8), NCCL 2.26.5 (nccl-library=22605), mpirun -n 8 all_reduce_perf -b 10G -e 10G -g 1 (one process per "
    "GPU), out-of-place"
)
GCM = (
    "theap06/gcm (a copy of Meta's facebookresearch/gcm), gcm/tests/health_checks_tests/test_check_nccl.py, "
    "nccl-tests output kept as test data"
)
GCM_1 = GCM + " (sample_single_success_output): 8 A100-SXM4-80GB, NCCL 2.16.2, one process per GPU, out-of-place"
GCM_2 = (
    GCM + " (sample_pairwise_success_output): 2 hosts (fairwus3, Azure ND A100 v4: 8 A100-SXM4-80GB, 8 HDR NICs), "
    "NCCL 2.12.12, one process per GPU, out-of-place"
)
MSCCLPP_NDV4 = (
    "microsoft/mscclpp, docs/performance-ndmv4.md (NDmv4: Azure ND A100 v4, 8 A100-SXM4-80GB on NVSwitch, 8 HDR "
    "NICs), NCCL 2.17.1+cuda11.8 (its own build, LD_PRELOAD), in-place, mpirun -map-by ppr:8:node all_reduce_perf "
    "-g 1 (one process per GPU) -G 1 (the timed calls launched as a CUDA graph) -w 10 -n 10"
)
MSCCLPP_1 = MSCCLPP_NDV4 + ", one node"
MSCCLPP_2 = MSCCLPP_NDV4 + ", two nodes"
GJ_AION = ISSUE_309 + ": gj-aion, another cluster of 8 H100 nodes on 400G InfiniBand (2025-06-18), NCCL's defaults"
GJ_AION_4 = GJ_AION + ", 4 of the 8 nodes, mpirun -np 32 -N 8 all_reduce_perf -b 1M -e 8G -f 2 -g 1, out-of-place"
GJ_AION_2 = GJ_AION + ", 2 of the 8 nodes, mpirun -np 16 -g 1, out-of-place"
GJ_AION_8 = GJ_AION + ", all 8 nodes, mpirun -np 64 -g 1, out-of-place"


@dataclass(frozen=True)
class Row:
    source: str
    system: str  # a key of SYSTEMS
    op: str
    size: int
    published_GBps: float  # nccl-tests busbw
    bound: float  # the largest |error| this row may have (5% for large sizes; else as measured, with `why`)
    algo: str = "auto"
    why: str = ""  # what the model lacks, where the bound is above 5%
    small: bool = True  # rerun by the test suite

    @property
    def version(self) -> str:
        """The NCCL release the row's run used (VERSIONS), else the latest the layer ports."""
        return next((v for source, v in VERSIONS.items() if self.source.startswith(source)), LATEST)

    @property
    def configuration(self) -> str:
        forced = "" if self.algo == "auto" else f", {self.algo} forced"
        release = "" if self.version == LATEST else f", NCCL {self.version}"
        return f"{self.op} {_size_text(self.size)}, {self.system}{forced}{release}"


def _size_text(size: int) -> str:
    unit = next((u for u, b in (("GiB", G), ("MiB", M), ("KiB", K)) if size >= b and size % b == 0), "B")
    return f"{size // {'GiB': G, 'MiB': M, 'KiB': K, 'B': 1}[unit]} {unit}"


def per_call(source: str, system: str, size: int, time_us: float, ranks: int, bound: float, why: str) -> Row:
    """An all_reduce row from a published time per call: the busbw nccl-tests prints for it,
    bytes x 2(n-1)/n / time."""
    busbw = size * BUSBW_FACTOR["all_reduce"](ranks) / (time_us * 1e3)
    return Row(f"{source}: {time_us} us per call", system, "all_reduce", size, busbw, bound, why=why)


LAUNCH = (
    "latency-bound, one process driving 8 GPUs (-g 8): the run is flat at 42-45 us per call from 1 to 16 KiB, the "
    "layer 33-36 us. Not its NCCL release: from 2.18.1 tuning.cc gives a ring LL call more latency (baseLat 6.6 "
    "against 3.6 us, 0.6 against 0.47 us per NVLink step), 2.2 us of the layer's time at 8 KiB (35.3 against 33.1 "
    "us under 2.9.9), and the same recipe's H100 page, also -g 8, takes 25.6 us per call; the OCI and "
    "superbenchmark hosts (-g 8, 2.9.9) take 32-36 us. What is left is this host's: nccl-tests issues its calls "
    "back to back (src/common.cu) and one thread launches the 8 GPUs' kernels in turn (src/group.cc doLaunches)"
)
GJ_CLUSTER = (
    "that cluster runs 7-10% below the same hardware elsewhere at 8 GiB (364.93 on 4 nodes, 466.73-468.46 on 2 "
    "in the same thread); NVIDIA points at its network's adaptive routing and settings, and with NCCL_MIN_CTAS=24 "
    "NCCL_IB_QPS_PER_CONNECTION=2 its 8 nodes reach 391.37 GB/s (24 NVLS channels, not NCCL's default 16)"
)
FIRST_SIZE = (
    "the run's first size: out-of-place {} us against {} us in place ({} GB/s), the warm-up of the first call; "
    "past it the tree's LL128 latency across nodes is short as below"
)
FIRST_2 = FIRST_SIZE.format(93.25, 82.98, 23.69) + " (+48% against the in-place figure)"
FIRST_4 = FIRST_SIZE.format(317.0, 93.26, 21.78) + " (+20% against the in-place figure)"
GJ_DIP = "this run's 256 MiB point is below its own 128 MiB one (234.35 against 246.41; 235.91 in place); " + GJ_CLUSTER
RING_RAMP = (
    "two nodes, ring, Simple under NCCL 2.12.12: the run ramps more slowly than the layer and than NCCL's own "
    "model, which are the same here (179.39 GB/s); 1 GiB is +3.2%"
)
TREE_LL128 = (
    "latency-bound (tree, LL128): 16-37 us per call more than the model on both clusters at 1 MiB over 2 and 8 "
    "nodes, where NCCL's own model is 19-54% fast too; a first-trip fill like LL's (20 warps x 1920 bytes per "
    "trip, prims_ll128.h) would bring these within 3% but put the same source's 256 KiB rows 23% slow and its "
    "four-node 1 MiB row 18% slow, so the layer leaves LL128's out (docs/calibration.md)"
)
MID_RING = (
    "ring, Simple, within one 384 MiB loop (24 channels x 8 ranks x 2 MiB chunks, runRing in all_reduce.h): the "
    "128 MiB call takes 1.99-2.02x the 64 MiB one in both runs (superbenchmark 1162.2 / 584.5 us, OCI 1191.2 / "
    "589.5) where the model's fixed costs make it 1.90x; NCCL's own model is 4% faster still, and no mechanism "
    "found in NCCL's source adds time at 128 MiB and not at 64 MiB"
)
MID_RING_32 = (
    "ring, Simple: 63-87 us per call more than the model in both runs without the Azure run's slowdown "
    "(superbenchmark 374.3 us, OCI 398.2 us); NCCL's own model is 4% faster still (open)"
)
A100_LL = (
    "ring, LL on one A100 node under NCCL 2.9.9, whose tuning.cc gives LL a quarter of the ring's bus bandwidth "
    "(58.75 GB/s; half, 87.7, from 2.21.5 on: +39.4% and +35.9% with the latest's constants). The runs take 75-77 "
    "us per 1 MiB call, the layer 62 us: between 512 KiB and 2 MiB each byte costs the OCI run 1/51 GB/s (the "
    "layer 1/57.5) and its calls 41 us beyond that (the layer 30 us: baseLat and its 14 NVLink steps) (open)"
)
GATHER_RAMP = (
    "out-of-place all_gather ramps more slowly than in-place on this host (1 GiB: 212.88 out of place, 220.61 in "
    "place, +3.4% against the latter; 8 GiB 223.39 and 230.07); the layer has one all_gather for both"
)
GRAPH_CALL = (
    "one process per GPU, the timed calls launched as a CUDA graph (-G 1): no host launch in the 16.96 us a call "
    "takes, which is NCCL's own work (tuning.cc under 2.17.1: ring LL 3.6 + 14 x 0.47 = 10.2 us). The layer takes "
    "30.4 us: that latency, and each of the 14 steps held to its NVLink path (GPU, NVSwitch, GPU: the topology's 1 us "
    "per link). The -g 8 hosts take 32-45 us at 1-16 KiB (LAUNCH), which that path time fills; a host launch cost "
    "the layer does not have (open)"
)
TWO_NODE_1K = (
    "two nodes, 1 KiB, CUDA graph: 35.85 us per call against the layer's 28.1 (tree, LL; NCCL's own model as the layer "
    "ports it: tree LL 25.3 us, ring LL 40.1 us); which of them 2.17.1 picked is not in the source, and the same run's "
    "single-node call is 13 us faster than the layer, so the gap is not a host cost (open)"
)
# The NCCL release each source ran (the start of its source text), where the source or its set-up names it;
# the others run the latest the layer ports. Only the single-node ring's constants differ between them.
VERSIONS = {
    OCI_A100: "2.9.9",
    SUPERBENCH_A100: "2.9.9",
    AZURE_A100: "2.22.3",
    AZURE_H100: "2.18.5",
    GCM_1: "2.16.2",
    GCM_2: "2.12.12",
    QOOFYK_4: "2.26.2",
    QOOFYK_2: "2.26.2",
    OCI_A100_G1: "2.26.5",
    MSCCLPP_NDV4: "2.17.1",
}
ROWS = [
    Row(AZURE_A100, "DGX A100", "all_reduce", 8 * G, 231.58, 0.05),
    Row(AZURE_A100, "DGX A100", "all_reduce", 1 * G, 228.10, 0.05),
    Row(AZURE_A100, "DGX A100", "all_reduce", 256 * M, 213.87, 0.05),
    Row(AZURE_A100, "DGX A100", "all_reduce", 1 * M, 36.22, 0.15),
    Row(AZURE_A100, "DGX A100", "all_reduce", 8 * K, 0.33, 0.25, why=LAUNCH),
    Row(OCI_A100, "DGX A100", "all_reduce", 8 * G, 235.14, 0.05),
    Row(OCI_A100, "DGX A100", "all_reduce", 1 * G, 230.08, 0.05),
    Row(OCI_A100, "DGX A100", "all_reduce", 256 * M, 221.38, 0.05),
    Row(OCI_A100, "DGX A100", "all_reduce", 64 * M, 199.23, 0.05),
    Row(OCI_A100, "DGX A100", "all_reduce", 128 * M, 197.17, 0.15, why=MID_RING),
    Row(OCI_A100, "DGX A100", "all_reduce", 1 * M, 23.92, 0.25, why=A100_LL),
    Row(OCI_A100, "DGX A100", "all_reduce", 8 * K, 0.44, 0.15),
    Row(OCI_A100_G1, "DGX A100", "all_reduce", 10 * G, 233.29, 0.05),
    Row(SUPERBENCH_A100, "DGX A100", "all_reduce", 8 * G, 235.26, 0.05),
    Row(SUPERBENCH_A100, "DGX A100", "all_reduce", 256 * M, 222.40, 0.05),
    Row(SUPERBENCH_A100, "DGX A100", "all_reduce", 64 * M, 200.91, 0.05),
    Row(SUPERBENCH_A100, "DGX A100", "all_reduce", 128 * M, 202.11, 0.15, why=MID_RING),
    Row(SUPERBENCH_A100, "DGX A100", "all_reduce", 32 * M, 156.89, 0.25, why=MID_RING_32),
    Row(SUPERBENCH_A100, "DGX A100", "all_reduce", 1 * M, 24.54, 0.25, why=A100_LL),
    Row(SUPERBENCH_A100, "DGX A100", "all_reduce", 8 * K, 0.40, 0.15),
    Row(SUPERBENCH_A100, "DGX A100", "all_gather", 8 * G, 223.39, 0.05),
    Row(SUPERBENCH_A100, "DGX A100", "all_gather", 1 * G, 212.88, 0.10, why=GATHER_RAMP),
    Row(SUPERBENCH_A100, "DGX A100", "reduce_scatter", 8 * G, 231.52, 0.05),
    Row(SUPERBENCH_A100, "DGX A100", "reduce_scatter", 1 * G, 223.54, 0.05),
    Row(AZURE_H100 + "; " + NVLS_RUN, "DGX H100", "all_reduce", 8 * G, 478.87, 0.05, algo="nvls"),
    Row(AZURE_H100, "DGX H100", "all_reduce", 1 * G, 466.35, 0.05, algo="nvls"),
    Row(AZURE_H100, "DGX H100", "all_reduce", 256 * M, 423.38, 0.05, algo="nvls"),
    Row(AZURE_H100, "DGX H100", "all_reduce", 1 * M, 43.70, 0.15, algo="nvls"),
    Row(AZURE_H100, "DGX H100", "all_reduce", 8 * K, 0.53, 0.15, algo="nvls"),
    Row(JEAUGEY_212 + ": NVLS all_reduce peak busBw ~480 GB/s on 8 GPUs", "DGX H100", "all_reduce", 8 * G, 480.0, 0.05),
    Row(
        JEAUGEY_212 + ": ~370 GB/s with NCCL_ALGO=RING", "DGX H100", "all_reduce", 8 * G, 370.0, 0.05, algo="nccl_ring"
    ),
    Row(JEAUGEY_212 + ": ~370 GB/s for non-allreduce operations", "DGX H100", "all_gather", 8 * G, 370.0, 0.05),
    Row(JEAUGEY_212 + ": ~370 GB/s for non-allreduce operations", "DGX H100", "reduce_scatter", 8 * G, 370.0, 0.05),
    Row(ISSUE_1281 + ": reduce_scatter busbw 360 GB/s", "DGX H100", "reduce_scatter", 8 * G, 360.0, 0.05),
    Row(ISSUE_1281 + ": all_gather busbw 350 GB/s", "DGX H100", "all_gather", 8 * G, 350.0, 0.05),
    Row(GCM_1, "DGX A100", "all_reduce", 1 * G, 231.72, 0.05),
    Row(GCM_1, "DGX A100", "all_reduce", 256 * M, 223.05, 0.05),
    Row(MSCCLPP_1, "DGX A100", "all_reduce", 1 * G, 231.45, 0.05),
    per_call(MSCCLPP_1, "DGX A100", 1 * K, 16.96, 8, 0.45, why=GRAPH_CALL),
    Row(GCM_2, "2 DGX A100, 8 HDR rails", "all_reduce", 1 * G, 182.80, 0.05),
    Row(GCM_2, "2 DGX A100, 8 HDR rails", "all_reduce", 256 * M, 169.69, 0.10, why=RING_RAMP),
    Row(MSCCLPP_2, "2 DGX A100, 8 HDR rails", "all_reduce", 4 * G, 188.18, 0.05),
    Row(MSCCLPP_2, "2 DGX A100, 8 HDR rails", "all_reduce", 1 * G, 183.82, 0.05),
    per_call(MSCCLPP_2, "2 DGX A100, 8 HDR rails", 1 * K, 35.85, 16, 0.30, why=TWO_NODE_1K),
    Row(JEAUGEY_160, "4 DGX A100, 8 HDR rails", "all_reduce", 1 * G, 192.0, 0.05),
    Row(QOOFYK_4, "4 DGX H100, 8 NDR rails", "all_reduce", 8 * G, 364.93, 0.05),
    Row(QOOFYK_4, "4 DGX H100, 8 NDR rails", "all_reduce", 1 * G, 358.14, 0.05),
    Row(QOOFYK_4, "4 DGX H100, 8 NDR rails", "all_reduce", 256 * M, 294.16, 0.05),
    Row(QOOFYK_4, "4 DGX H100, 8 NDR rails", "all_reduce", 1 * M, 24.73, 0.15),
    Row(QOOFYK_4, "4 DGX H100, 8 NDR rails", "all_reduce", 8 * K, 0.34, 0.15),
    Row(GJ_AION_4, "4 DGX H100, 8 NDR rails", "all_reduce", 8 * G, 324.52, 0.10, why=GJ_CLUSTER),
    Row(QOOFYK_2, "2 DGX H100, 8 NDR rails", "all_reduce", 8 * G, 468.46, 0.05),
    Row(QOOFYK_2, "2 DGX H100, 8 NDR rails", "all_reduce", 256 * M, 392.35, 0.05),
    Row(QOOFYK_2, "2 DGX H100, 8 NDR rails", "all_reduce", 1 * M, 27.33, 0.30, why=TREE_LL128),
    Row(QOOFYK_2, "2 DGX H100, 8 NDR rails", "all_reduce", 8 * K, 0.48, 0.15),
    Row(GJ_AION_2, "2 DGX H100, 8 NDR rails", "all_reduce", 8 * G, 466.73, 0.05),
    Row(GJ_AION_2, "2 DGX H100, 8 NDR rails", "all_reduce", 256 * M, 388.31, 0.05),
    Row(GJ_AION_2, "2 DGX H100, 8 NDR rails", "all_reduce", 1 * M, 21.08, 0.70, why=FIRST_2),
    Row(GJ_AION_4, "4 DGX H100, 8 NDR rails", "all_reduce", 256 * M, 234.35, 0.30, why=GJ_DIP),
    Row(GJ_AION_4, "4 DGX H100, 8 NDR rails", "all_reduce", 1 * M, 6.41, 3.10, why=FIRST_4),
    Row(GJ_AION_8, "8 DGX H100, 8 NDR rails", "all_reduce", 8 * G, 320.70, 0.15, why=GJ_CLUSTER),
    Row(GJ_AION_8, "8 DGX H100, 8 NDR rails", "all_reduce", 256 * M, 270.31, 0.10, why=GJ_CLUSTER),
    Row(GJ_AION_8, "8 DGX H100, 8 NDR rails", "all_reduce", 1 * M, 17.64, 0.25, why=TREE_LL128),
    Row(
        ISSUE_267,
        "6 DGX H100, 8 NDR rails",
        "all_to_all",
        1 * G,
        48.5,
        0.15,
        why="nccl-tests' alltoall busbw also counts the pieces that stay on NVLink ((n-1)/n of the bytes "
        "against (n-G)/n over the NICs), so it can exceed one NIC (the thread's own question); the figure is the NIC's",
    ),
]


def _graph(row: Row):
    spec, system = SYSTEMS[row.system]
    graph = parse_spec(spec)
    graph.graph[NCCL] = NcclConfig(system=system, version=row.version)
    return graph


def simulated(row: Row) -> tuple[float, str, str]:
    """(busbw GB/s, algorithm, protocol) of the row's collective on its system."""
    graph = _graph(row)
    n = len(gpu_nodes(graph))
    seconds, _ = time_collective(graph, row.op, row.algo, None, float(row.size))
    algo, protocol = resolve_protocol(graph, row.op, row.algo, range(n), float(row.size))
    return row.size / seconds / 1e9 * BUSBW_FACTOR[row.op](n), algo, protocol


def error(row: Row, busbw_GBps: float) -> float:
    return (busbw_GBps - row.published_GBps) / row.published_GBps


def table(rows: list[Row]) -> str:
    lines = [
        "| source | configuration | NCCL's choice | published busbw | simulated | error | bound |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    errors = []
    for row in rows:
        busbw, algo, protocol = simulated(row)
        errors.append(abs(error(row, busbw)))
        lines.append(
            f"| {row.source} | {row.configuration} | {algo}/{protocol} | {row.published_GBps:.2f} GB/s | "
            f"{busbw:.2f} GB/s | {error(row, busbw):+.1%} | {row.bound:.0%} |"
        )
    lines.append(f"\nMedian absolute error over {len(rows)} rows: {statistics.median(errors):.1%}.")
    return "\n".join(lines)


# Full sweeps. The Azure tables: in-place busbw (GB/s) of all_reduce_perf -b 8 -e 8G -f 2 -g 8 -n 40 under
# NCCL_ALGO=NVLS (Benchmarks/NCCLBandwidth.py), NCCL 2.18.5 by the pages (not for A100: AZURE_A100), at
# 1 KiB, 2 KiB, ... 8 GiB (the tables' "1K" .. "8G" rows; their "65K" is 64 KiB and so on). Read at
# Azure/AI-benchmarking-guide 8fd0c6e.
SWEEP_SIZES = tuple(K << k for k in range(24))
SWEEPS = {
    (AZURE_A100, "DGX A100", "auto"): (
        0.04, 0.08, 0.17, 0.33, 0.67, 1.37, 2.70, 5.15, 10.11, 19.24, 36.22, 53.54,
        71.43, 89.99, 109.22, 132.77, 166.63, 174.18, 213.87, 221.58, 228.10, 230.22, 230.48, 231.58,
    ),
    (AZURE_H100, "DGX H100", "nvls"): (
        0.07, 0.14, 0.27, 0.53, 0.95, 1.71, 2.72, 5.40, 10.86, 21.35, 43.70, 81.93,
        128.73, 172.13, 234.45, 295.53, 361.78, 400.61, 423.38, 438.46, 466.35, 472.36, 475.54, 478.87,
    ),
    # The OCI tutorial's one-node table, out-of-place busbw at the same sizes: another A100 host and NCCL,
    # 20% faster than Azure's at 64 MiB, the same within 2% from 256 MiB on
    (OCI_A100, "DGX A100", "auto"): (
        0.06, 0.11, 0.22, 0.44, 0.88, 1.79, 3.24, 5.96, 10.15, 15.56, 23.92, 32.66,
        54.57, 79.02, 119.81, 147.46, 199.23, 197.17, 221.38, 223.26, 230.08, 231.52, 234.17, 235.14,
    ),
    # superbenchmark's A100 table, out-of-place busbw at the same sizes: within 7% of OCI's from 32 MiB on
    (SUPERBENCH_A100, "DGX A100", "auto"): (
        0.05, 0.10, 0.20, 0.40, 0.79, 1.56, 3.03, 5.57, 9.65, 15.21, 24.54, 39.26,
        65.52, 90.63, 129.90, 156.89, 200.91, 202.11, 222.40, 223.68, 230.29, 231.76, 234.37, 235.26,
    ),
    # nccl-tests#309's 4-node table, out-of-place busbw at the same sizes (its 2 MiB point, 21.24, is
    # below its 1 MiB one; the in-place column has 30.74 there)
    (QOOFYK_4, "4 DGX H100, 8 NDR rails", "auto"): (
        0.05, 0.10, 0.19, 0.34, 0.65, 1.29, 2.50, 4.55, 7.49, 13.94, 24.73, 21.24,
        53.77, 74.78, 125.23, 172.92, 224.53, 262.48, 294.16, 334.58, 358.14, 361.56, 363.54, 364.93,
    ),
    # Meta's gcm test data: one A100 node and two, out-of-place busbw from 32 MiB to 1 GiB
    (GCM_1, "DGX A100", "auto"): (None,) * 15 + (170.31, 210.68, 204.26, 223.05, 226.63, 231.72, None, None, None),
    (GCM_2, "2 DGX A100, 8 HDR rails", "auto"): (None,) * 15 + (96.76, 131.49, 144.60, 169.69, 176.80, 182.80)
    + (None,) * 3,
    # nccl-tests#309's first table: two bare-metal XE9680, NCCL 2.26.2, out-of-place busbw at the same sizes
    (QOOFYK_2, "2 DGX H100, 8 NDR rails", "auto"): (
        0.06, 0.14, 0.25, 0.48, 0.94, 1.80, 3.63, 6.34, 10.10, 12.65, 27.33, 51.58,
        83.33, 118.57, 169.67, 234.81, 269.98, 336.29, 392.35, 426.97, 448.90, 461.24, 466.52, 468.46,
    ),
    # the second cluster of nccl-tests#309 from 1 MiB (None: sizes its runs did not cover); its 8-node 8 MiB point
    # (12.98 out-of-place, 51.38 in place) and 4-node 1 MiB point (6.41, 21.78 in place) are the runs' outliers
    (GJ_AION_2, "2 DGX H100, 8 NDR rails", "auto"): (None,) * 10 + (
        21.08, 41.73, 70.91, 103.78, 156.07, 228.91, 263.66, 335.25, 388.31, 423.57, 447.65, 459.29, 465.77, 466.73,
    ),
    (GJ_AION_4, "4 DGX H100, 8 NDR rails", "auto"): (None,) * 10 + (
        6.41, 17.91, 35.13, 68.01, 106.75, 157.14, 208.34, 246.41, 234.35, 288.88, 322.02, 322.71, 324.99, 324.52,
    ),
    (GJ_AION_8, "8 DGX H100, 8 NDR rails", "auto"): (None,) * 10 + (
        17.64, 28.78, 40.52, 12.98, 87.36, 129.63, 184.00, 227.97, 270.31, 300.51, 286.81, 319.03, 319.83, 320.70,
    ),
}  # fmt: skip


def sweep_rows(source: str, system: str, algo: str) -> list[Row]:
    """One all_reduce row per size of a sweep (no bound: the sweep shows the shape, fit or not)."""
    busbws = SWEEPS[(source, system, algo)]
    pairs = zip(SWEEP_SIZES, busbws)
    return [Row(source, system, "all_reduce", s, b, math.inf, algo=algo) for s, b in pairs if b is not None]


def nccl_model(row: Row, algo: str, protocol: str) -> float:
    """busbw GB/s NCCL's own cost model (ncclTopoGetAlgoTime) predicts for the row's call as (algo, protocol)."""
    graph = _graph(row)
    n = len(gpu_nodes(graph))
    shape = nccl_shape(describe(graph), list(range(n)))
    seconds = nccl_tuning.algo_time_us(row.op, ALGOS[algo], protocol, shape, row.size) * 1e-6
    return row.size / seconds / 1e9 * BUSBW_FACTOR[row.op](n)


def sweep_table(source: str, system: str, algo: str) -> str:
    """A sweep as markdown: published, simulated and NCCL-model busbw, errors, and the time gap."""
    forced = "NCCL's own choice" if algo == "auto" else f"{algo} forced"
    lines = [
        f"{system}, all_reduce, {forced}: {', '.join(source.split(', ')[:2])}",
        "",
        "| size | NCCL's choice | published busbw | simulated | error | NCCL's model | its error | "
        "published - simulated time |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in sweep_rows(source, system, algo):
        busbw, chosen, protocol = simulated(row)
        model = nccl_model(row, chosen, protocol)
        factor = BUSBW_FACTOR[row.op](len(gpu_nodes(_graph(row))))
        gap_us = (row.size * factor / row.published_GBps - row.size * factor / busbw) / 1e3
        lines.append(
            f"| {_size_text(row.size)} | {chosen}/{protocol} | {row.published_GBps:.2f} GB/s | {busbw:.2f} GB/s | "
            f"{error(row, busbw):+.1%} | {model:.2f} GB/s | {error(row, model):+.1%} | {gap_us:+.1f} us |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="only the rows the test suite reruns")
    small = parser.parse_args().small
    print(table([row for row in ROWS if row.small or not small]))
    if not small:
        for key in SWEEPS:
            print("\n" + sweep_table(*key))


if __name__ == "__main__":
    main()
