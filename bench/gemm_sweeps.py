"""The kernel model's GEMM times against the published cuBLASLt sweeps it is built on
(sim/scenario/gemm_sweeps.py, Azure/AI-benchmarking-guide): every shape of every GPU, the measured
and the modelled TFLOP/s and the error. Each sweep's largest square is its chip's ceiling (exact by
construction); every other row is a prediction, bounded in tests/sim/cost/test_gemm_sweeps.py.

    python bench/gemm_sweeps.py            # print the table
    python bench/gemm_sweeps.py --write    # also put it in docs/calibration.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from clustersim.sim.cost import gemm
from clustersim.sim.scenario.chips import CHIPS
from clustersim.sim.scenario.gemm_sweeps import BY_GPU
from clustersim.sim.scenario.hardware import GPUS

DOC = Path(__file__).resolve().parent.parent / "docs" / "calibration.md"
BEGIN, END = "<!-- gemm table: bench/gemm_sweeps.py --write -->", "<!-- end of gemm table -->"


def table() -> str:
    """The rows as docs/calibration.md prints them, and the median error of the shapes >= 4096."""
    lines = ["| GPU, inputs | m x n x k | published | model | error |", "| --- | --- | ---: | ---: | ---: |"]
    large = []
    for name, sweep in BY_GPU.items():
        fp8 = sweep.input_bytes == 1
        anchor = sweep.largest_square()
        for m, n, k, measured in sweep.rows:
            modelled = 2.0 * m * n * k / gemm.gemm_time_s(CHIPS[name], GPUS[name], m, n, k, fp8=fp8)
            err, ceiling = modelled / measured - 1, (m, n, k, measured) == anchor
            if min(m, n, k) >= 4096 and not ceiling:
                large.append(abs(err))
            note = " (ceiling)" if ceiling else ""
            lines.append(
                f"| {name}, {'FP8' if fp8 else 'FP16'} | {m} x {n} x {k}{note} | {measured / 1e12:.1f} TFLOP/s | "
                f"{modelled / 1e12:.1f} TFLOP/s | {err:+.1%} |"
            )
    lines.append(
        f"\nShapes with every dimension >= 4096, ceilings left out: {len(large)}; median absolute error "
        f"{statistics.median(large):.1%}, worst {max(large):.1%}."
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="put the table in docs/calibration.md")
    args = parser.parse_args()
    text = table()
    print(text)
    if args.write:
        doc = DOC.read_text()
        start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
        DOC.write_text(doc[:start] + "\n" + text + "\n" + doc[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
