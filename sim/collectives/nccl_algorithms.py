"""NCCL's algorithms as steps over flows: rings per rail, double binary trees, NVLS, PXN all-to-all.

Each generator reads `plan.nccl` (sim.collectives.nccl.Tuned: protocol, rates, latencies, each
rank's rail) and `plan.nodes`. The data moves are those of the textbook algorithms (exact,
checked against numpy); what changes is the traffic they put on the fabric and the latency of
each step:

- **Channels, one ring per rail** (src/graph/rings.cc, search.cc): with G GPUs per node there are G
  rings; ring c enters every node at its GPU on rail c and visits the node's GPUs from there
  (ending on rail c-1), and its inter-node hop lands on the next node's rail-c GPU through rail
  c's NICs (with PXN, the last GPU hands the chunk over NVLink to the rail-c GPU first). Each ring carries 1/G of
  the buffer, so every NIC carries the same bytes (a flat ring would cross nodes through one).
  The 2(n-1) steps of a ring are NCCL's pipeline: a chunk enters the next hop as soon as it has
  landed (src/device/prims_*.h), so latency is paid per step, not per chunk.
- **PXN** (src/graph/paths.cc, NCCL_PXN_DISABLE): an inter-node message whose destination sits
  on another rail first crosses NVLink to the sender-node GPU of the destination's rail and
  leaves through that rail's NIC; the two hops go out together (pipelined chunk by chunk).
- **Tree** (src/graph/trees.cc, ncclGetDtree): across nodes, two binary trees, the second the
  mirror (even node count) or shift (odd) of the first, each reducing up and broadcasting down
  half of the data, per rail; inside a node a chain from the rail's GPU. Reduce and broadcast
  are pipelined, so up and down traffic flow at once: one step carries all of it.
- **NVLS** (NVLink SHARP, H100): the switch reduces (multimem.ld_reduce) and multicasts
  (multimem.st): each GPU sends M and receives M/G for the reduce, sends M/G and receives M for
  the broadcast, so each GPU link carries M(1 + 1/G) per direction, carried here as one flow per
  GPU to its neighbour (on a non-blocking switch only the per-port bytes matter). NVLS-tree adds
  the rail trees across nodes for each GPU's 1/G slice.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from clustersim.sim.collectives import direct, ring
from clustersim.sim.collectives.nccl import Tuned
from clustersim.sim.collectives.steps import CollectiveError, Plan, Step


def _nodes(plan: Plan) -> tuple[tuple[int, ...], ...]:
    """The group's ranks on each node, in rail order (a flat fabric: one node)."""
    rails = _tuned(plan).rails
    return tuple(tuple(sorted(node, key=rails.__getitem__)) for node in plan.nodes or (tuple(range(plan.n)),))


def rail_layout(plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(node of each rank, rail of each rank, members[node, rail] = the rank there or -1)."""
    nodes, rails = _nodes(plan), np.array(_tuned(plan).rails, np.int64)
    node_of = np.zeros(plan.n, np.int64)
    members = np.full((len(nodes), int(rails.max()) + 1 if len(rails) else 1), -1, np.int64)
    for k, ranks in enumerate(nodes):
        for r in ranks:
            node_of[r], members[k, rails[r]] = k, r
    return node_of, rails, members


def _tuned(plan: Plan) -> Tuned:
    if plan.nccl is None:
        raise CollectiveError("an NCCL algorithm needs the NCCL layer on (a topology with nccl settings)")
    return plan.nccl


def retraffic(plan: Plan, src, dst, nbytes, apply, latency_s: float) -> Step:
    """The step's messages as NCCL moves them: NVLink and NIC hops at their rates, PXN relays."""
    tuned = _tuned(plan)
    node_of, rail_of, members = rail_layout(plan)
    src, dst, nbytes = np.asarray(src, np.int64), np.asarray(dst, np.int64), np.asarray(nbytes, float)
    same = node_of[src] == node_of[dst]
    via = members[node_of[src], rail_of[dst]] if len(src) else src
    relay = ~same & (via >= 0) & (via != src) if tuned.pxn else np.zeros(len(src), bool)
    direct_inter = ~same & ~relay
    parts = [
        (src[same], dst[same], nbytes[same] * tuned.intra_factor),
        (src[relay], via[relay], nbytes[relay] * tuned.intra_factor),
        (via[relay], dst[relay], nbytes[relay] * tuned.inter_factor),
        (src[direct_inter], dst[direct_inter], nbytes[direct_inter] * tuned.inter_factor),
    ]
    src, dst, nbytes = (np.concatenate([p[i] for p in parts]) for i in range(3))
    return Step(src, dst, nbytes, apply, latency_s)


def _rail_rings(plan: Plan) -> list[list[int]]:
    """One ring per rail when every node has as many GPUs of the group; else the plain ring."""
    nodes = _nodes(plan)
    if not nodes or len(nodes) == 1 or len({len(m) for m in nodes}) != 1:
        return [list(range(plan.n))]
    per_node = len(nodes[0])
    return [[r for node in nodes for r in node[c:] + node[:c]] for c in range(per_node)]


def _ring_steps(plan: Plan, reduce_scatter: bool, all_gather: bool) -> Iterator[Step]:
    tuned, rings = _tuned(plan), _rail_rings(plan)
    k = len(rings)
    pieces = plan.pieces(k * plan.n)  # piece r*k + c: ring c's share of rank r's chunk
    table = [[pieces[r * k + c] for r in rng] for c, rng in enumerate(rings)]
    phases = []
    if reduce_scatter:
        phases.append(ring.ring_reduce_scatter(rings, table))
    if all_gather:
        phases.append(ring.ring_all_gather(rings, table))
    for i, step in enumerate(itertools.chain(*phases)):
        latency = tuned.hop_latency_s + (tuned.base_latency_s if i == 0 else 0.0)
        yield retraffic(plan, step.src, step.dst, step.nbytes, step.apply, latency)


def ring_all_reduce(plan: Plan) -> Iterator[Step]:
    yield from _ring_steps(plan, True, True)


def ring_reduce_scatter(plan: Plan) -> Iterator[Step]:
    yield from _ring_steps(plan, True, False)


def ring_all_gather(plan: Plan) -> Iterator[Step]:
    yield from _ring_steps(plan, False, True)


def _all_reduce_data(plan: Plan):
    """The buffers' all-reduce, done as the ring's data moves (one apply for a one-step algorithm)."""
    steps = list(ring.all_reduce(plan))

    def apply(work, ufunc) -> None:
        for step in steps:
            step.apply(work, ufunc)

    return apply


def binary_tree(count: int, rank: int) -> int:
    """The parent of `rank` in NCCL's binary tree over `count` ranks (ncclGetBtree), -1 at the root."""
    if rank == 0:
        return -1
    bit = 1
    while bit < count and not bit & rank:
        bit <<= 1
    up = (rank ^ bit) | (bit << 1)
    return up if up < count else rank ^ bit


def double_tree(count: int) -> list[list[tuple[int, int]]]:
    """(child, parent) edges of NCCL's two trees over `count` nodes (ncclGetDtree): the btree, and
    its shift (odd count) or mirror (even count)."""
    first = [(r, binary_tree(count, r)) for r in range(count) if binary_tree(count, r) >= 0]
    if count % 2:
        second = [((c + 1) % count, (p + 1) % count) for c, p in first]
    else:
        second = [(count - 1 - c, count - 1 - p) for c, p in first]
    return [first, second]


def _tree_traffic(plan: Plan, slice_bytes: float) -> tuple[list[int], list[int], list[float]]:
    """Inter-node tree messages, per rail: each tree edge carries half the slice up and down."""
    src: list[int] = []
    dst: list[int] = []
    nodes = _nodes(plan)
    for c in range(len(nodes[0])):
        for tree in double_tree(len(nodes)):
            for child, parent in tree:
                a, b = nodes[child][c], nodes[parent][c]
                src += [a, b]
                dst += [b, a]
    return src, dst, [slice_bytes / 2] * len(src)


def tree_all_reduce(plan: Plan) -> Iterator[Step]:
    """Per rail c: a chain inside each node from GPU c (reduce up, broadcast down: M/G each way
    per hop) and the double binary tree of the nodes' GPU c across nodes."""
    tuned, nodes = _tuned(plan), _nodes(plan)
    per_node = len(nodes[0])
    share = plan.nbytes / per_node
    src, dst, nbytes = _tree_traffic(plan, share)
    for node in nodes:
        for c in range(per_node):
            chain = node[c:] + node[:c]
            for a, b in zip(chain[:-1], chain[1:]):
                src += [a, b]
                dst += [b, a]
                nbytes += [share, share]
    latency_s = tuned.base_latency_s + tuned.hop_latency_s + tuned.fill_s  # fill: LL's first trip (nccl.tune)
    yield retraffic(plan, src, dst, nbytes, _all_reduce_data(plan), latency_s)


def _nvls_traffic(plan: Plan) -> tuple[list[int], list[int], list[float]]:
    nodes = _nodes(plan)
    src: list[int] = []
    dst: list[int] = []
    for node in nodes:
        if len(node) > 1:
            src += list(node)
            dst += list(node[1:] + node[:1])
    per_node = len(nodes[0])
    return src, dst, [plan.nbytes * (1 + 1 / per_node)] * len(src)


def nvls_all_reduce(plan: Plan) -> Iterator[Step]:
    """One step at the port load, after NCCL's latency and the pipeline's fill (nccl.nvls_fill_s)."""
    tuned = _tuned(plan)
    src, dst, nbytes = _nvls_traffic(plan)
    latency_s = tuned.base_latency_s + tuned.hop_latency_s + tuned.fill_s
    yield retraffic(plan, src, dst, nbytes, _all_reduce_data(plan), latency_s)


def nvls_tree_all_reduce(plan: Plan) -> Iterator[Step]:
    """NVLS inside each node, and per rail the double binary tree across nodes for that GPU's slice."""
    tuned, nodes = _tuned(plan), _nodes(plan)
    src, dst, nbytes = _nvls_traffic(plan)
    tsrc, tdst, tbytes = _tree_traffic(plan, plan.nbytes / len(nodes[0]))
    yield retraffic(
        plan,
        src + tsrc,
        dst + tdst,
        nbytes + tbytes,
        _all_reduce_data(plan),
        tuned.base_latency_s + tuned.hop_latency_s,
    )


def pxn_all_to_all(plan: Plan) -> Iterator[Step]:
    """Every piece at once (as direct), inter-node pieces relayed through the destination's rail."""
    tuned = _tuned(plan)
    for step in direct.all_to_all(plan):
        yield retraffic(plan, step.src, step.dst, step.nbytes, step.apply, tuned.base_latency_s + tuned.hop_latency_s)
