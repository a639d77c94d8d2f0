"""Network speed at scale: one all-to-all of 1 MiB per ordered pair, as one bulk of flows.

Cases: 512 GPUs (261,632 flows) on torus:8x8x8 and on a 64-node fat tree; 1,024 GPUs
(1,047,552 flows) on torus:8x8x16 and on a 128-node fat tree. The fat trees run twice: with
adaptive load balance (ideal spraying: a few re-shares) and with static per-flow ECMP hashing,
whose collisions give thousands of distinct rates and finish times, so thousands of re-shares.
Prints wall seconds (routing included), re-shares, flows re-shared per second (sum over
re-shares of the flows given new rates, per wall second) and the simulated time.

    python bench/network.py [--only SPEC]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import simpy

from clustersim.sim.network.network import Network
from clustersim.sim.scenario.spec import parse_spec

CASES = (
    "torus:8x8x8",
    "fattree:nodes=64,gpus_per_node=8,load_balance=adaptive",
    "fattree:nodes=64,gpus_per_node=8,load_balance=ecmp",
    "torus:8x8x16",
    "fattree:nodes=128,gpus_per_node=8,load_balance=adaptive",
    "fattree:nodes=128,gpus_per_node=8,load_balance=ecmp",
)
TARGET_S = {512: 20.0, 1024: 10.0}
PER_PAIR_BYTES = 2**20


def all_to_all(spec: str) -> dict:
    graph = parse_spec(spec)
    n = sum(1 for _, d in graph.nodes(data=True) if d["kind"] == "gpu")
    src, dst = np.divmod(np.arange(n * n), n)
    off = src != dst
    start = time.perf_counter()
    network = Network(simpy.Environment(), graph)
    network.transfer_many(src[off], dst[off], PER_PAIR_BYTES, "all_to_all")
    network.env.run()
    wall = time.perf_counter() - start
    return {
        "spec": spec,
        "gpus": n,
        "flows": int(off.sum()),
        "wall_s": wall,
        "reshares": network.reshares,
        "flow_reshares_per_s": network.flows_reshared / wall,
        "simulated_s": network.env.now,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run one case (a topology spec)")
    args = parser.parse_args()
    for spec in [args.only] if args.only else CASES:
        r = all_to_all(spec)
        target = f"target < {TARGET_S[r['gpus']]:g} s" if r["gpus"] in TARGET_S else "no target"
        print(
            f"{r['spec']:<54} {r['gpus']:5d} GPUs {r['flows']:9,d} flows  wall {r['wall_s']:7.2f} s "
            f"({target})  {r['reshares']:4d} re-shares  {r['flow_reshares_per_s']:12,.0f} flows "
            f"re-shared/s  simulated {r['simulated_s'] * 1e3:.3f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
