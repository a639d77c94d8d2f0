"""Engine speed: simulated ops per second on a large 1F1B program, against a bare SimPy loop.

The baseline is the cheapest thing SimPy can do: one process yielding one timeout per op, for
as many ops as the program has, timed in the same run. The ratio says how much of SimPy's raw
event rate the engine keeps while it also tracks dependencies, moves messages over the max-min
network and records spans.

It times three programs of about the same op count: the 1F1B pipeline with free communication
(zero-byte messages, zero latency: the engine's own cost, which the 0.3 target is about); the
same pipeline moving 25 MB activations through the max-min network (half its ops are messages,
each one a re-share of the fabric); and compute ops only (one stage).

    python bench/engine.py [--pp 16] [--microbatches 256]
"""

from __future__ import annotations

import argparse
import time

import simpy

from schedules.pipeline import build_program, rank_order
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


def engine_rate(pp: int, microbatches: int, activation_bytes: float = 25e6,
                latency_s: float = 1e-6) -> tuple[float, int, float]:
    """(ops per second, number of ops, simulated step seconds) for a 1F1B program on one switch."""
    program = build_program(rank_order("1f1b", pp, microbatches), microbatches, {s: s for s in range(pp)},
                            activation_bytes, forward_flops=lambda s: 1e12, backward_flops=lambda s: 2e12)
    num_ops = sum(len(ops) for ops in program.ops.values())
    network = Network(simpy.Environment(), switch(pp, 300e9, latency_s))
    start = time.perf_counter()
    log = run_program(program, network, compute_time_s=lambda op: op.flops / 150e12)
    return num_ops / (time.perf_counter() - start), num_ops, log.makespan_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=256)
    args = parser.parse_args()
    free, num_ops, free_step_s = engine_rate(args.pp, args.microbatches, activation_bytes=0.0, latency_s=0.0)
    networked, _, step_s = engine_rate(args.pp, args.microbatches)
    compute_only, _, _ = engine_rate(1, num_ops // 2)
    bare = bare_simpy_rate(num_ops)
    print(f"program: 1F1B pp={args.pp} microbatches={args.microbatches}, {num_ops} ops; simulated step "
          f"{free_step_s:.4f} s with free communication, {step_s:.4f} s over a 300 GB/s switch")
    print(f"bare simpy:                          {bare:12,.0f} events/s")
    print(f"engine, 1F1B, free communication:    {free:12,.0f} ops/s   ratio {free / bare:.3f} (target >= 0.3)")
    print(f"engine, 1F1B, 25 MB over the network:{networked:12,.0f} ops/s   ratio {networked / bare:.3f}")
    print(f"engine, compute ops only:            {compute_only:12,.0f} ops/s   ratio {compute_only / bare:.3f}")


if __name__ == "__main__":
    main()
