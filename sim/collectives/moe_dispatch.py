"""The MoE token exchange as DeepEP and HybridEP run it (Megatron-Core's "flex" token dispatcher):
each token crosses to another node once, then fans out over NVLink.

Megatron-Core's alltoall dispatcher permutes a rank's T tokens into T k rows, one per (token,
expert) of its top k, and all-to-alls them: rank i sends every rank j the rows of j's experts. A
token whose experts sit on several GPUs of one remote node crosses the network once per expert.
DeepEP (deepseek-ai/DeepEP, the DeepSeek-V3 report's section 3.2.2: "tokens ... first transmitted
via IB to the GPUs with the same in-node index on their target nodes ... then instantly forwarded
via NVLink to specific GPUs that host their target experts") and HybridEP (Megatron-Core's flex
dispatcher's other backend) send a token to each remote node it needs once, to the GPU on the
sender's rail, which forwards one copy to each local GPU holding any of its experts; inside the
sender's node, one copy per GPU. The combine sends the expert outputs back the same way, summed
per GPU and per node on the way (the same bytes in the other direction).

With the rank's send buffer S = T k h bytes (the alltoall dispatcher's, what the program sizes),
each token's experts k distinct of E spread evenly, e = E / n per rank of the n-rank group, and
routing balanced (every expert its share, as the load-balancing losses aim at and as
moe_router_force_load_balancing makes it):

    P(a token needs rank j)       p_gpu  = 1 - C(E - e, k) / C(E, k)
    P(a token needs node m)       p_node = 1 - C(E - e R_m, k) / C(E, k)      (R_m ranks on m)
    rank i -> each rank j of its node                 S / k x p_gpu     (NVLink)
    rank i -> its rail peer on each other node m      S / k x p_node    (the network)
    that peer -> each other rank j of node m          S / k x p_gpu     (NVLink, for rank i's tokens)

Qwen3-30B-A3B over 16 ranks on 2 nodes (E 128, k 8, e 8, R 8): p_gpu 0.41, p_node 0.997, so a
rank sends the other node 0.997 S / 8 where the alltoall dispatcher sends S / 2: 4 times fewer
bytes on the NICs. Node-limited routing (DeepSeek-V3's 4 of 8 nodes) is not in p_node: tokens
are taken to pick among all experts. The steps of the two hops run at once (DeepEP and HybridEP
pipeline them in chunks); the NVLink and NIC rates and the latency are the NCCL layer's for a
point-to-point exchange (sim.collectives.nccl, "pxn" tuning); the kernels' own SM budget is not
modelled. The data moved is the all-to-all's (sim.collectives.direct), so the numerics are exact.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

from clustersim.sim.collectives import direct
from clustersim.sim.collectives.nccl_algorithms import rail_layout, retraffic
from clustersim.sim.collectives.steps import CollectiveError, Plan, Step

PREFIX = "flex:"


def algorithm_name(top_k: int, experts: int) -> str:
    """The all_to_all algorithm name of a flex exchange of top_k of `experts` experts."""
    return f"{PREFIX}{top_k}/{experts}"


def parse(name: str) -> tuple[int, int] | None:
    """(top_k, experts) of a flex algorithm name, None for another name."""
    if not name.startswith(PREFIX):
        return None
    top_k, _, experts = name[len(PREFIX) :].partition("/")
    if not (top_k.isdigit() and experts.isdigit()) or not 0 < int(top_k) <= int(experts):
        raise CollectiveError(f"flex algorithm {name!r}: expected flex:TOP_K/EXPERTS with 0 < TOP_K <= EXPERTS")
    return int(top_k), int(experts)


def hit_probability(experts: int, top_k: int, held: int) -> float:
    """P(a token's top_k distinct experts, drawn evenly from `experts`, include one of `held`)."""
    return 1.0 - math.comb(experts - held, top_k) / math.comb(experts, top_k)


def flex_all_to_all(plan: Plan, top_k: int, experts: int) -> Iterator[Step]:
    """One step: the token copies of the module docstring, both hops at once."""
    n = plan.n
    if experts % n:
        raise CollectiveError(f"flex all_to_all: {experts} experts do not spread evenly over {n} ranks")
    tuned = plan.nccl
    if tuned is None:
        raise CollectiveError("the flex all_to_all needs the NCCL layer on (a topology with nccl settings)")
    held = experts // n
    per_token = plan.nbytes / top_k  # S / k
    to_gpu = per_token * hit_probability(experts, top_k, held)
    node_of, rail_of, members = rail_layout(plan)
    src: list[int] = []
    dst: list[int] = []
    nbytes: list[float] = []
    for i in range(n):
        for node in range(members.shape[0]):
            local = [int(j) for j in members[node] if j >= 0]
            if node == node_of[i]:
                hops = [(i, j, to_gpu) for j in local if j != i]
            else:
                peer = int(members[node, rail_of[i]]) if members[node, rail_of[i]] >= 0 else local[0]
                to_node = per_token * hit_probability(experts, top_k, held * len(local))
                hops = [(i, peer, to_node)] + [(peer, j, to_gpu) for j in local if j != peer]
            for s, d, b in hops:
                src.append(s)
                dst.append(d)
                nbytes.append(b)
    moves = next(direct.all_to_all(plan))
    yield retraffic(plan, src, dst, nbytes, moves.apply, tuned.base_latency_s + tuned.hop_latency_s)


def algorithm(name: str):
    """The step generator of a flex name (parse), or None for another name."""
    parsed = parse(name)
    return None if parsed is None else functools.partial(flex_all_to_all, top_k=parsed[0], experts=parsed[1])
