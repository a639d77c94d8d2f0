"""Published GEMM throughput against shape, one method on several GPUs: the kernel model's matmul
ceilings come from here (sim.scenario.chips) and its tests check every other shape against it.

Azure/AI-benchmarking-guide (github.com/Azure/AI-benchmarking-guide, commit 8fd0c6e, 2024-09),
Azure_Results/ND_A100_v4_results.md, ND_H100_v5_results.md and ND_H200_v5_results.md, section
"GEMM CuBLASLt". The method (Benchmarks/GEMMCublasLt.py, run_model_sizes) runs the cublaslt_gemm
micro-benchmark of microsoft/superbenchmark as forked by gitaumark/superbenchmark: A and B filled
with uniform random numbers in [-1, 1] (random data draws the power a training step draws; zeros
would let the clock rise), a TN GEMM through cuBLASLt's first heuristic algorithm (no autotuning),
FP32 accumulation, 10,000 warm-up calls and 1,000 timed ones back to back on one stream (so the
launch gaps are inside the time). A100: FP16 in and out (the A100 has no FP8). H100 and H200: FP8
(e4m3) A and B with fast accumulation, FP16 out, as Transformer Engine's FP8 GEMMs write 16-bit
results. TFLOP/s as m n (2k - 1) / time, which differs from 2 m n k by 1/(2k): at most 0.05% here.
"""

from __future__ import annotations

from dataclasses import dataclass

SOURCE = "Azure/AI-benchmarking-guide Azure_Results/{}, GEMM CuBLASLt (2024-09)"


@dataclass(frozen=True)
class GemmSweep:
    """One GPU's published GEMM throughputs: (m, n, k, FLOP/s) rows, inputs of `input_bytes` each,
    results of `output_bytes`."""

    gpu: str  # as the results page names it
    input_bytes: int
    output_bytes: int
    rows: tuple[tuple[int, int, int, float], ...]
    source: str

    def largest_square(self) -> tuple[int, int, int, float]:
        """The biggest m = n = k row: the least launch, epilogue and wave overhead per FLOP."""
        return max((r for r in self.rows if r[0] == r[1] == r[2]), key=lambda r: r[0])


# TFLOPS as the three pages print them; "-": not measured (the A100 page stops at 16384^3).
# ND A100 v4: NVIDIA A100-SXM4-80GB, CUDA 12.5, driver 550.90.07. ND H100 v5: NVIDIA H100 80GB HBM3
# (SXM), CUDA 12.6, driver 560.35.03. ND H200 v5: NVIDIA H200 141GB, CUDA 12.6, driver 560.28.03.
TABLE = """
     m      n      k   A100   H100   H200
  1024   1024   1024  119.4  274.1  290.8
  2048   2048   2048  221.8 1011.3 1013.4
  4096   4096   4096  228.0 1216.9 1249.1
  8192   8192   8192  253.7 1290.1 1300.6
 16384  16384  16384  256.5 1377.3 1366.3
 32768  32768  32768      - 1382.2 1349.5
  1024   2145   1024  132.8  410.7  407.9
  6144  12288  12288  250.8 1351.4 1318.0
802816    192    768  157.8  663.8  717.5
"""


def _column(index: int) -> tuple[tuple[int, int, int, float], ...]:
    """The (m, n, k, FLOP/s) rows of TABLE's `index`-th GPU column that were measured."""
    lines = [line.split() for line in TABLE.strip().splitlines()[1:]]
    return tuple((int(f[0]), int(f[1]), int(f[2]), float(f[3 + index]) * 1e12) for f in lines if f[3 + index] != "-")


A100_SXM4_80GB = GemmSweep("NVIDIA A100-SXM4-80GB", 2, 2, _column(0), SOURCE.format("ND_A100_v4_results.md"))
H100_SXM_FP8 = GemmSweep("NVIDIA H100 80GB HBM3", 1, 2, _column(1), SOURCE.format("ND_H100_v5_results.md"))
H200_FP8 = GemmSweep("NVIDIA H200 141GB", 1, 2, _column(2), SOURCE.format("ND_H200_v5_results.md"))
# The sweeps by the GPU name of sim.scenario.hardware they were measured on
BY_GPU = {"A100-SXM-80GB": A100_SXM4_80GB, "H100-SXM": H100_SXM_FP8, "H200": H200_FP8}
