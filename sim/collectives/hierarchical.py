"""Hierarchical all-reduce for nodes of G GPUs joined by a slower fabric (P nodes, n = P x G).

Phases (each a set of concurrent rings, see sim.collectives.ring):
1. intra-node reduce-scatter: on every node a ring of its G GPUs; local GPU l ends with node
   chunk l (1/G of the buffer) summed over its node.
2. inter-node all-reduce: for every local index l a ring through GPU l of each node (a "rail")
   all-reduces node chunk l: reduce-scatter then all-gather of pieces of M/(GP).
3. intra-node all-gather: the G node chunks are gathered back on every GPU of every node.

Cost, with alpha_i, B_i inside a node and alpha_o, B_o between nodes (and the G rails not
sharing inter-node links, as on a rail-optimised fat tree):
    2(G-1)(alpha_i + M/(G B_i)) + 2(P-1)(alpha_o + M/(G P B_o)).
Only M/G per GPU crosses the slow fabric per phase-2 direction, and only 2(P-1) slow latencies
are paid, against 2(n-1) for one flat ring through every GPU.

The node structure comes from `Plan.nodes` (local ranks per node, equal counts, each listed in
rail order); the runner reads it from the topology graph.
"""

from __future__ import annotations

from collections.abc import Iterator

from clustersim.sim.collectives.ring import ring_all_gather, ring_reduce_scatter
from clustersim.sim.collectives.steps import CollectiveError, Plan, Step, require


def all_reduce(plan: Plan) -> Iterator[Step]:
    nodes = plan.nodes
    if nodes is None:
        raise CollectiveError("hierarchical needs the node structure (a topology with gpus per node)")
    sizes = {len(node) for node in nodes}
    require(len(sizes) == 1, f"hierarchical needs the same number of GPUs on every node, got {sorted(sizes)}")
    num_nodes, per_node = len(nodes), sizes.pop()
    pieces = plan.pieces(plan.n)  # piece l*P + p: rail l's share p
    node_chunk = [
        (slice(pieces[g * num_nodes][0].start, pieces[(g + 1) * num_nodes - 1][0].stop), plan.nbytes / per_node)
        for g in range(per_node)
    ]

    intra = [list(node) for node in nodes]
    intra_pieces = [node_chunk] * num_nodes
    rails = [[node[g] for node in nodes] for g in range(per_node)]
    rail_pieces = [pieces[g * num_nodes : (g + 1) * num_nodes] for g in range(per_node)]

    yield from ring_reduce_scatter(intra, intra_pieces)
    yield from ring_reduce_scatter(rails, rail_pieces)
    yield from ring_all_gather(rails, rail_pieces)
    yield from ring_all_gather(intra, intra_pieces)
