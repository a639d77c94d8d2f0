"""What the per-kernel compute model (sim.cost.gemm, sim.cost.kernels) knows of each accelerator
beyond the roofline's GpuSpec (sim.scenario.hardware): its compute units and clock, the GEMM tiles
its libraries run, a matmul ceiling measured on it (sim.scenario.gemm_sweeps), the share of the datasheet HBM
bandwidth a streaming kernel reaches, and the gap a kernel launch costs. One description per
type, each number with its source; a scenario never tunes them.

The datasheet peak is compute_units x tensor_flops_per_clock x boost_clock_hz (a test checks it
against GpuSpec.peak_flops). The kernel model's GEMM rate is anchored to the measured matmul
ceiling (sim.cost.gemm.mainloop_rate), so gpu_overrides.peak_flops and .efficiency, the
roofline's knobs, do not change it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from clustersim.sim.scenario import gemm_sweeps
from clustersim.sim.scenario.hardware import GPUS


@dataclass(frozen=True)
class MatmulCeiling:
    """The best matmul throughput measured on a chip (BF16, or FP8 inputs), and the (m, n, k)
    shape that reached it."""

    m: int
    n: int
    k: int
    flops: float  # FLOP/s
    source: str
    output_bytes: int = 2  # bytes per element of the result (BF16/FP16); its epilogue writes them


@dataclass(frozen=True)
class AttentionMeasurement:
    """A measured run of the unfused attention core (scores, softmax, dropout, context; no flash
    attention) forward and backward: batch x heads sequences of seq_len tokens, head_dim each, on
    a GPU of hbm_bandwidth_Bps (datasheet)."""

    gpu: str
    hbm_bandwidth_Bps: float
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    dtype_bytes: int
    forward_s: float
    backward_s: float
    source: str
    attention_dropout: bool = True  # the measured core ran its dropout (p > 0)


@dataclass(frozen=True)
class FusedAttentionRun:
    """A measured fused (flash) attention kernel, forward or backward: batch x heads sequences of
    seq_len tokens, head_dim each, causal or not, at `flops` FLOP/s in the FlashAttention
    benchmarks' count (sim.cost.flash_attention.measured_s)."""

    backward: bool
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    causal: bool
    flops: float
    source: str
    dtype_bytes: int = 2


@dataclass(frozen=True)
class ChipSpec:
    compute_units: int  # streaming multiprocessors (GPU) or matrix units (TPU MXUs)
    boost_clock_hz: float  # the clock the datasheet's tensor peak assumes
    tensor_flops_per_clock: int  # dense BF16 tensor FLOP per clock per unit
    fp8_peak_flops: float | None  # dense FP8 tensor FLOP/s; None: no FP8 tensor cores
    exp_per_clock: int | None  # exponentials per clock per unit (a GPU's SFUs), for softmax in flash attention
    tiles: tuple[
        tuple[int, int], ...
    ]  # (rows, cols) of the output tiles its GEMM kernels compute, one per unit at a time
    matmul_ceiling: MatmulCeiling | None  # None: no published measurement, no kernel model
    hbm_efficiency: float  # achievable fraction of the datasheet HBM bandwidth, streaming
    launch_overhead_s: float  # gap between two kernels back to back on one stream
    fp8_matmul_ceiling: MatmulCeiling | None = None  # FP8 inputs (float8_e4m3fn); None: no FP8 GEMMs
    # the unfused attention core measured (sim.cost.attention_core); None: it streams at hbm_efficiency
    unfused_attention: AttentionMeasurement | None = None
    # fused attention measured, a pass each (sim.cost.flash_attention); none: the GEMM main loop's rate
    fused_attention: tuple[FusedAttentionRun, ...] = ()
    # an FP8 GEMM main loop's time when it promotes its partial sums to FP32 as it goes (cuBLASLt's
    # FAST_ACCUM off, the "split accumulator") over the fast accumulation its FP8 ceiling ran with
    fp8_split_accumulation: float = 1.0
    # the units a GEMM kernel may use while a collective's kernels hold the rest (Transformer
    # Engine's _math_sms, schedules.tp_overlap); None: all of them
    gemm_units: int | None = None


# NVIDIA, "Matrix Multiplication Background User's Guide" (DU-09799-001, 2023), section 2.3 "Typical
# tile dimensions in cuBLAS and performance": cuBLAS's most efficient tiles for large GEMMs are
# 256x128 and 128x256, then 128x128; a kernel computes one output tile per SM at a time, so the
# tiles run in waves of (SM count) (section 3.2, wave quantization).
CUBLAS_TILES = ((256, 128), (128, 256), (128, 128))


def sweep_ceiling(sweep: gemm_sweeps.GemmSweep) -> MatmulCeiling:
    """A published sweep's largest square GEMM as the chip's ceiling."""
    m, n, k, flops = sweep.largest_square()
    return MatmulCeiling(m, n, k, flops, f"{sweep.source}: {sweep.gpu} {m}^3", sweep.output_bytes)


# The matmul ceilings the kernel model's main-loop rates come from (sim.cost.gemm.mainloop_rate):
# the largest square GEMM of Azure's cuBLASLt sweeps (sim.scenario.gemm_sweeps), one method on
# every GPU it covers: random inputs, 1,000 calls back to back after 10,000 warm-up calls, so the
# GPU runs at its power limit as it does through a training step's GEMMs. A100-SXM4-80GB FP16
# 256.5 TFLOPS at 16384^3; H100 SXM FP8 1382.2 at 32768^3; H200 FP8 1349.5 at 32768^3 (its
# 16384^3 reads 1.2% higher: the sweep's noise). The A100 rows ran 2021-22 cuBLAS; Horace He's
# 8192^3 of that time, 258 TFLOPS with randn inputs (thonking.ai, "Strangely, Matrix
# Multiplications on GPUs Run Faster When Given 'Predictable' Data!"), is within 2% of the model.
A100_CEILING = sweep_ceiling(gemm_sweeps.A100_SXM4_80GB)
H100_FP8_CEILING = sweep_ceiling(gemm_sweeps.H100_SXM_FP8)
H200_FP8_CEILING = sweep_ceiling(gemm_sweeps.H200_FP8)
# No sweep measured the H100 in BF16. Stas Bekman's "Maximum Achievable Matmul FLOPS" table
# (stas00/ml-engineering compute/accelerator/README.md; mamf-finder.py, torch.mm, randn, a search
# of shapes) gives 794.5 TFLOPS at 2048x2048x13312 (torch 2.7.0+cu126). It reads high against a
# sustained sweep: mamf-finder times each call alone between a 256 MiB write (its L2 flush) and a
# copy into C, so the GEMMs hold the GPU a fraction of the time, and it reports the best shape of
# the search; its FP8 row, 1402.6 at 1024x9216x14336, is 1.5% above Azure's best. The long k
# keeps the epilogue 2% of that GEMM, so the main loop's rate depends little on the epilogue's
# model. H200 and H800 are the same GH100 SXM5 part (132 SMs, same clocks and power limit).
H100_CEILING = MatmulCeiling(2048, 2048, 13312, 794.5e12, "stas00/ml-engineering MAMF table: NVIDIA H100 SXM")

# Achievable HBM bandwidth, streaming: BabelStream's CUDA Copy kernel (one read and one write per
# element, the pattern of the norms, activations, dropouts and casts) as Azure measured it on each
# GPU for its AI-benchmarking-guide (Azure/AI-benchmarking-guide, Azure_Results/ND_*_results.md,
# "HBM Bandwidth", 2024-09; Benchmarks/HBMBandwidth.py builds BabelStream's CUDA model), over the
# datasheet bandwidth of sim.scenario.hardware: A100-SXM4-80GB 1.61 TB/s (ND A100 v4), H100 80GB
# HBM3 2.90 (ND H100 v5), H200 141GB 4.01 (ND H200 v5). One method on every GPU; the A100 40 GB
# (HBM2) is taken at the 80 GB's fraction, not measured.
A100_HBM_EFFICIENCY = 1.61e12 / GPUS["A100-SXM-80GB"].hbm_bandwidth_Bps
H100_HBM_EFFICIENCY = 2.90e12 / GPUS["H100-SXM"].hbm_bandwidth_Bps
H200_HBM_EFFICIENCY = 4.01e12 / GPUS["H200"].hbm_bandwidth_Bps
# Chips without such a measurement: OpenCL-Benchmark (ProjectPhysX) on a GH200 (HBM3, 4.0 TB/s
# datasheet) measured 3,614.6 GB/s coalesced read and 3,704.8 GB/s coalesced write
# (mredenti/PowerCapping, configuration/OpenCL_benchmark.md): 0.90 of the datasheet.
HBM_EFFICIENCY = 0.90

# NVIDIA technical blog, "Getting Started with CUDA Graphs" (Alan Gray, 2019): a 2.9 us kernel
# launched back to back on one stream takes 3.8 us per kernel: about 1 us between kernels. (These
# figures are as we recall the blog; our search tools did not reach its text to re-read them.)
LAUNCH_OVERHEAD_S = 1e-6

# CUDA C++ Programming Guide, section "Arithmetic Instructions", throughput table: "32-bit
# floating-point reciprocal, ..., base 2 exponential (exp2f), ...": 16 results per clock per SM on
# compute capability 6.0 and 7.x (read in an edition that stops at 7.x); we carry the 16 to 8.0
# and 9.0, whose columns we did not read.
SFU_PER_CLOCK = 16

# Dao et al. 2022, "FlashAttention" (arXiv:2205.14135), Appendix E.5 "Benchmarking Attention": the
# attention core alone (no projections) on one A100 40 GB, batch 16, 8 heads of dim 64, FP16,
# attention dropout 0.1, no mask, mean of 100 calls; the "Megatron" row (Megatron-LM's unfused
# core) at sequence length 2048: forward 6.56 ms (Table 15), backward 10.80 ms (Table 16). (Its
# "PyTorch Attention" row, another unfused implementation, is within 1%: 6.56 and 10.77 ms.) The
# A100 40 GB datasheet bandwidth is 1,555 GB/s (sim.scenario.hardware).
A100_UNFUSED_ATTENTION = AttentionMeasurement(
    "A100 40GB",
    1555e9,
    16,
    8,
    2048,
    64,
    2,
    6.56e-3,
    10.80e-3,
    "Dao et al. 2022 (arXiv:2205.14135) Tables 15 and 16, Megatron row, sequence length 2048",
)

# cuDNN's fused attention on an H100 80GB SXM5 (700 W), what Transformer Engine runs there (its
# attention.py of v1.9, the NeMo 24.07 container's: "Disabling FlashAttention to give FusedAttention
# preference on Hopper+"), as Shah et al. 2024 ("FlashAttention-3", arXiv:2407.08608) measured it
# beside FlashAttention-2 and -3, 16k tokens a batch (batch x seq_len) and 16 heads of 128, FP16:
# - forward, causal, seq 4096: 518 TFLOP/s (the paper's forward figure, panel (d) "with causal
#   mask, head dim 128"; the bar label in Dao-AILab/flash-attention assets/flash3_fp16_fwd.png);
# - backward, seq 4096: 499 TFLOP/s (the paper's "Attention backward speed, head dim 128 (H100
#   80GB SXM5)" figure, which is not in the repository: its bar labels as two machine
#   transcriptions of it agree, subtext.edge.nugit.net image f60142e2...). That figure has no
#   causal mask: its FlashAttention-2 bars, 291 at 2k and 310 at 4k, are FlashAttention-2's
#   non-causal backward got from its H100 forward + backward figure (flash2_h100_fwd_bwd_benchmark.png,
#   320 and 326) less the forward figure's 362 and 368: 306 and 312; its causal ones would be 254 and 285.
# The same figures test the other lengths (tests/sim/cost/test_flash_attention.py).
H100_FUSED_ATTENTION = (
    FusedAttentionRun(False, 4, 16, 4096, 128, True, 518e12, "Shah et al. 2024 forward figure (d), cuDNN, 4k"),
    FusedAttentionRun(True, 4, 16, 4096, 128, False, 499e12, "Shah et al. 2024 backward figure, hdim 128, cuDNN, 4k"),
)

# FP8 GEMMs that promote their partial sums to FP32 every few k steps (cuBLASLt
# CUBLASLT_MATMUL_DESC_FAST_ACCUM = 0; Transformer Engine runs its input- and weight-gradient
# GEMMs so, module/base.py of v1.9: _2X_ACC_DGRAD = _2X_ACC_WGRAD = True, _2X_ACC_FPROP = False)
# against the fast accumulation Azure's FP8 sweep ran with (superbenchmark's cublaslt_utils.cc
# sets fastAccuMode = 1). The only figure found in text: "enabling fast accumulation can lead to a
# 1.1x to 1.2x speedup" (pytorch/ao#2377, 2025-06-14, an H100 float8 training benchmark whose
# shapes are in an image); taken at 1.15, the middle of that range, on the main loop. The weakest
# number of this description: no per-shape measurement of it was found (pytorch/ao#1325 and
# triton-lang/triton#2513 plot theirs; pytorch/FBGEMM#3904 calls CUTLASS's "very bad").
H100_FP8_SPLIT_ACCUMULATION = 1.15

# NVIDIA A100 Tensor Core GPU Architecture whitepaper: 108 SMs, boost 1410 MHz, 1024 dense
# FP16/BF16 FMA per clock per SM (2048 FLOP); no FP8.
_A100 = ChipSpec(
    108,
    1.41e9,
    2048,
    None,
    SFU_PER_CLOCK,
    CUBLAS_TILES,
    A100_CEILING,
    A100_HBM_EFFICIENCY,
    LAUNCH_OVERHEAD_S,
    unfused_attention=A100_UNFUSED_ATTENTION,
)
# NVIDIA H100 Tensor Core GPU Architecture whitepaper, SXM5: 132 SMs, 4096 dense BF16 FLOP per clock
# per SM; 989.4 TFLOPS dense BF16 and 1,978.9 dense FP8 at 1830 MHz (989.4e12 / (132 x 4096)).
_H100 = ChipSpec(
    132,
    1.83e9,
    4096,
    1978.9e12,
    SFU_PER_CLOCK,
    CUBLAS_TILES,
    H100_CEILING,
    H100_HBM_EFFICIENCY,
    LAUNCH_OVERHEAD_S,
    H100_FP8_CEILING,
    fused_attention=H100_FUSED_ATTENTION,
    fp8_split_accumulation=H100_FP8_SPLIT_ACCUMULATION,
)

CHIPS: dict[str, ChipSpec] = {
    "A100-SXM-80GB": _A100,
    "A100-SXM-40GB": _A100,
    "H100-SXM": _H100,
    "H200": dataclasses.replace(_H100, fp8_matmul_ceiling=H200_FP8_CEILING, hbm_efficiency=H200_HBM_EFFICIENCY),
    "H800-SXM": _H100,
    # Jouppi et al., "TPU v4: An Optically Reconfigurable Supercomputer" (ISCA 2023), Table: 2
    # TensorCores of 4 MXUs (128x128 bf16 multiply-accumulate) at 1050 MHz = 275 TFLOPS; no FP8.
    # No published matmul ceiling we could cite: the kernel model refuses it (roofline only).
    "TPU-v4": ChipSpec(8, 1.05e9, 2 * 128 * 128, None, None, ((128, 128),), None, HBM_EFFICIENCY, LAUNCH_OVERHEAD_S),
    # TPU v5p: 2 TensorCores of 4 MXUs each (docs.cloud.google.com/tpu/docs/v5p-training); the
    # clock is not published: 459 TFLOPS / (8 x 32,768 FLOP/clock) = 1.75 GHz, derived, not a source.
    "TPU-v5p": ChipSpec(
        8,
        459e12 / (8 * 2 * 128 * 128),
        2 * 128 * 128,
        None,
        None,
        ((128, 128),),
        None,
        HBM_EFFICIENCY,
        LAUNCH_OVERHEAD_S,
    ),
}
