"""One transformer layer's forward and backward time against Korthikanti et al. 2022 Table 4.

Korthikanti et al. 2022 (arXiv:2205.05198), Table 4, "Time to complete the forward and backward
pass of a single transformer layer of the 22B model" (Table 3's 22B: h 6144, 64 heads, s 2048,
micro-batch 4, tensor parallel 8 on one DGX A100), in five experiments: baseline (no recompute),
sequence parallelism, full recompute, selective recompute, selective + sequence parallelism.

How a layer's time is read off the simulation: the 22B Table 5 scenario
(scenarios/calibration/k22b_selective.yaml) with the experiment's recompute and sequence
parallelism is run with its 48 layers and with 24; rank 0's forward of its one microbatch (first
piece's start to last piece's end, the tensor-parallel collectives between the pieces included:
they block the compute stream, as Megatron's do) and its backward (with what it recomputes) are
taken from the event log, and a layer's time is their difference over the 24 layers between the two
runs. The embedding, the LM head and the loss, the same in both, drop out.

    python bench/layer_times.py                        # each scenario's compute model (kernel)
    python bench/layer_times.py --compute-model roofline
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from clustersim.schedules.ir import Phase
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario
from clustersim.sim.scenario.schema import Scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "calibration" / "k22b_selective.yaml"
SOURCE = "Korthikanti et al. 2022 (arXiv:2205.05198) Table 4"
LAYERS = (48, 24)  # the 22B's layers, and half of them: the difference is 24 layers' time


@dataclass(frozen=True)
class Experiment:
    name: str
    recompute: str  # none, selective, full
    sequence_parallel: bool
    forward_ms: float  # published
    backward_ms: float


EXPERIMENTS = [
    Experiment("baseline, no recompute", "none", False, 7.7, 11.9),
    Experiment("sequence parallelism", "none", True, 7.2, 11.8),
    Experiment("baseline with full recompute", "full", False, 7.7, 19.5),
    Experiment("selective recompute", "selective", False, 7.7, 13.2),
    Experiment("selective + sequence parallelism", "selective", True, 7.2, 13.1),
]


def scenario_of(experiment: Experiment, layers: int, compute_model: str | None = None) -> Scenario:
    """The 22B scenario with the experiment's recompute and sequence parallelism, `layers` layers."""
    base = load_scenario(SCENARIO)
    cluster = (
        base.cluster if compute_model is None else base.cluster.model_copy(update={"compute_model": compute_model})
    )
    return base.model_copy(
        update={
            "cluster": cluster,
            "model": base.model.model_copy(update={"layers": layers}),
            "training": base.training.model_copy(update={"recompute": experiment.recompute}),
            "parallel": base.parallel.model_copy(update={"sequence_parallel": experiment.sequence_parallel}),
        }
    )


def pass_seconds(scenario: Scenario) -> tuple[float, float]:
    """Rank 0's forward and backward of microbatch 0 at stage 0, first start to last end."""
    ops = simulate(scenario).log.whole_ops
    (f_start, f_end), (b_start, b_end) = ops[(0, Phase.F, 0, 0)], ops[(0, Phase.B, 0, 0)]
    return f_end - f_start, b_end - b_start


def layer_ms(experiment: Experiment, compute_model: str | None = None) -> tuple[float, float]:
    """One layer's simulated forward and backward (ms): the passes' growth per added layer."""
    (f_all, b_all), (f_half, b_half) = (pass_seconds(scenario_of(experiment, n, compute_model)) for n in LAYERS)
    added = LAYERS[0] - LAYERS[1]
    return 1e3 * (f_all - f_half) / added, 1e3 * (b_all - b_half) / added


def error(published: float, value: float) -> float:
    return (value - published) / published


def rows(compute_model: str | None = None) -> list[tuple[str, float, float]]:
    """(configuration, published ms, simulated ms) of each experiment's forward and backward."""
    out = []
    for e in EXPERIMENTS:
        forward, backward = layer_ms(e, compute_model)
        out += [(f"22B layer, TP 8, {e.name}: forward", e.forward_ms, forward)]
        out += [(f"22B layer, TP 8, {e.name}: backward", e.backward_ms, backward)]
    return out


def table(computed: list[tuple[str, float, float]]) -> str:
    """The rows as docs/calibration.md prints them, with their median and worst error."""
    lines = ["| source | configuration | published | simulated | error |", "| --- | --- | ---: | ---: | ---: |"]
    lines += [f"| {SOURCE} | {c} | {p:.1f} ms | {v:.2f} ms | {error(p, v):+.1%} |" for c, p, v in computed]
    errors = [abs(error(p, v)) for _, p, v in computed]
    lines.append(
        f"\nLayer rows: {len(errors)}; median absolute error {statistics.median(errors):.1%}, worst {max(errors):.1%}."
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compute-model", choices=["roofline", "kernel"], help="default: the scenario's own")
    args = parser.parse_args()
    print(table(rows(args.compute_model)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
