"""Engine speed: simulated ops per second on a large 1F1B program, against a bare SimPy loop.

The baseline is the cheapest thing SimPy can do: one process yielding one timeout per op, for
as many ops as the program has, timed in the same run. The ratio says how much of SimPy's raw
event rate the engine keeps while it also tracks dependencies, moves messages over the max-min
network and records spans.

It times two programs: the 1F1B pipeline (half its ops are sends and receives, each a message
through the max-min network) and the same op count of compute only (one stage, no messages),
which isolates the engine's own per-op cost from the network's.

    python bench/engine.py [--pp 16] [--microbatches 256]
"""

from __future__ import annotations

import argparse
import time

import simpy

from schedules.pipeline import build_program, stage_order
from sim.engine import run_program
from sim.network import Network
from topologies.switch import switch


def bare_simpy_rate(num_events: int) -> float:
    """Events per second of one process yielding `num_events` unit timeouts."""
    env = simpy.Environment()

    def loop():
        for _ in range(num_events):
            yield env.timeout(1.0)

    env.process(loop())
    start = time.perf_counter()
    env.run()
    return num_events / (time.perf_counter() - start)


def engine_rate(pp: int, microbatches: int) -> tuple[float, int, float]:
    """(ops per second, number of ops, simulated step seconds) for a 1F1B program on one switch."""
    program = build_program(stage_order("1f1b", pp, microbatches), microbatches, {s: s for s in range(pp)},
                            activation_bytes=25e6, forward_flops=lambda s: 1e12, backward_flops=lambda s: 2e12)
    num_ops = sum(len(ops) for ops in program.ops.values())
    network = Network(simpy.Environment(), switch(pp, 300e9, 1e-6))
    start = time.perf_counter()
    log = run_program(program, network, compute_time_s=lambda op: op.flops / 150e12)
    return num_ops / (time.perf_counter() - start), num_ops, log.makespan_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=256)
    args = parser.parse_args()
    ops_per_s, num_ops, step_s = engine_rate(args.pp, args.microbatches)
    compute_only, _, _ = engine_rate(1, num_ops // 2)
    bare = bare_simpy_rate(num_ops)
    print(f"program: 1F1B pp={args.pp} microbatches={args.microbatches}, {num_ops} ops, simulated step {step_s:.4f} s")
    print(f"bare simpy:                {bare:12,.0f} events/s")
    print(f"engine, 1F1B pipeline:     {ops_per_s:12,.0f} ops/s   ratio {ops_per_s / bare:.3f} (target >= 0.3)")
    print(f"engine, compute ops only:  {compute_only:12,.0f} ops/s   ratio {compute_only / bare:.3f}")


if __name__ == "__main__":
    main()
