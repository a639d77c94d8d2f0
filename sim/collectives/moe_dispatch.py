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
bytes on the NICs. With node-limited routing (DeepSeek-V3's: the experts in G equal groups, a
token's k within its best M groups) a token picks M groups evenly, then k experts among their
M E / G; the odds of missing a set of experts are then averaged over the token's C(G, M) choices
of groups (by counting, over how many of the set's experts each group holds). DeepSeek-V3's 256
experts in 8 groups, 4 per token, on 8 nodes of one group each: p_node 0.45, against 0.66
without the limit. The steps of the two hops run at once (DeepEP and HybridEP
pipeline them in chunks); the NVLink and NIC rates and the latency are the NCCL layer's for a
point-to-point exchange (sim.collectives.nccl, "pxn" tuning); the kernels' own SM budget is not
modelled. The data moved is the all-to-all's (sim.collectives.direct), so the numerics are exact.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from clustersim.sim.collectives import direct
from clustersim.sim.collectives.nccl_algorithms import rail_layout, retraffic
from clustersim.sim.collectives.steps import CollectiveError, Plan, Step

PREFIX = "flex:"


@dataclass(frozen=True)
class Routing:
    """How a token picks its experts: top_k distinct of `experts`, within its best `limited` of
    `groups` equal blocks of experts (limited = groups: anywhere)."""

    top_k: int
    experts: int
    groups: int = 1
    limited: int = 1

    def __post_init__(self):
        g, m, k, e = self.groups, self.limited, self.top_k, self.experts
        if not (0 < k <= e and 0 < m <= g and e % g == 0 and k <= m * e // g):
            raise CollectiveError(
                f"flex routing: top {k} of {e} experts within {m} of {g} groups is not a routing (0 < top_k <= "
                "the limited groups' experts, groups dividing the experts)"
            )

    @property
    def name(self) -> str:
        """The all_to_all algorithm name of a flex exchange with this routing."""
        return f"{PREFIX}{self.top_k}/{self.experts}/{self.groups}/{self.limited}"

    def hit_probability(self, held: Sequence[int]) -> float:
        """P(a token's experts include one of the experts numbered in `held`)."""
        per_group = self.experts // self.groups
        overlaps = [0] * self.groups
        for expert in held:
            overlaps[expert // per_group] += 1
        # ways[j][t]: sets of j groups holding t of `held` between them
        ways = [[0] * (len(held) + 1) for _ in range(self.limited + 1)]
        ways[0][0] = 1
        for overlap in overlaps:
            for j in range(self.limited, 0, -1):
                for t in range(len(held), overlap - 1, -1):
                    ways[j][t] += ways[j - 1][t - overlap]
        pool = self.limited * per_group  # the experts of a token's groups
        miss = sum(count * math.comb(pool - t, self.top_k) for t, count in enumerate(ways[self.limited]))
        return 1.0 - miss / (math.comb(self.groups, self.limited) * math.comb(pool, self.top_k))


def parse(name: str) -> Routing | None:
    """The routing of a flex algorithm name, None for another name."""
    if not name.startswith(PREFIX):
        return None
    fields = name[len(PREFIX) :].split("/")
    if len(fields) != 4 or not all(f.isdigit() for f in fields):
        raise CollectiveError(f"flex algorithm {name!r}: expected flex:TOP_K/EXPERTS/GROUPS/LIMITED")
    return Routing(*(int(f) for f in fields))


def flex_all_to_all(plan: Plan, routing: Routing) -> Iterator[Step]:
    """One step: the token copies of the module docstring, both hops at once. EP rank r of the
    group (its r-th member) holds experts r e .. (r + 1) e - 1."""
    n = plan.n
    if routing.experts % n:
        raise CollectiveError(f"flex all_to_all: {routing.experts} experts do not spread evenly over {n} ranks")
    tuned = plan.nccl
    if tuned is None:
        raise CollectiveError("the flex all_to_all needs the NCCL layer on (a topology with nccl settings)")
    held = routing.experts // n
    per_token = plan.nbytes / routing.top_k  # S / k
    node_of, rail_of, members = rail_layout(plan)
    experts_of = [range(r * held, (r + 1) * held) for r in range(n)]
    to_gpu = [per_token * routing.hit_probability(experts_of[r]) for r in range(n)]
    nodes = [[int(j) for j in row if j >= 0] for row in members]
    to_node = [per_token * routing.hit_probability([e for j in node for e in experts_of[j]]) for node in nodes]
    hops: list[tuple[int, int, float]] = []  # (from, to, bytes)
    for i in range(n):
        for node, local in enumerate(nodes):
            if node == node_of[i]:
                hops += [(i, j, to_gpu[j]) for j in local if j != i]
            else:
                peer = int(members[node, rail_of[i]]) if members[node, rail_of[i]] >= 0 else local[0]
                hops += [(i, peer, to_node[node])] + [(peer, j, to_gpu[j]) for j in local if j != peer]
    src, dst, nbytes = zip(*hops) if hops else ((), (), ())
    moves = next(direct.all_to_all(plan))
    yield retraffic(plan, src, dst, nbytes, moves.apply, tuned.base_latency_s + tuned.hop_latency_s)


def algorithm(name: str):
    """The step generator of a flex name (parse), or None for another name."""
    routing = parse(name)
    return None if routing is None else functools.partial(flex_all_to_all, routing=routing)
