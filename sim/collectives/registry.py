"""ALGORITHMS: collective -> {algorithm name -> step generator}, and the `auto` choice.

The `auto` rule (M = nccl-tests' size, n = ranks in the group, SMALL = 256 KiB):

| collective | auto picks |
| --- | --- |
| p2p | direct |
| all_to_all | direct (one step; the fabric shares links max-min; pairwise would add n-2 latencies) |
| all_reduce | torus when the group is a whole torus of 2+ axes longer than 1 (bidirectional rings per axis, k |
| | parts in rotated axis orders so every link is busy); else hierarchical when the group spans 2+ nodes |
| | with the same 2+ GPUs on each; else, for M <= SMALL (latency-bound), halving_doubling if n is a power |
| | of two, tree otherwise; else ring |
| reduce_scatter, all_gather | halving_doubling for M <= SMALL and n a power of two; else ring |
| broadcast, reduce | tree for M <= SMALL; else ring (pipelined chain) |
| gather, scatter | tree for M <= SMALL; else direct |

With the NCCL layer on (the graph carries sim.collectives.nccl's settings), `auto` for all_reduce,
reduce_scatter and all_gather is NCCL's own choice among its ring, tree, NVLS and NVLS-tree (the
least time of its tuning model, sim.collectives.nccl_tuning), and for all_to_all `pxn`; the other
collectives keep the table above. An all_to_all may also be asked for as `flex:K/E/G/M`, an MoE
exchange as DeepEP and HybridEP run it (sim.collectives.moe_dispatch: top K of E experts, within the
best M of G groups).

Large messages get the unidirectional ring, NCCL's default shape (busbw tends to the link bandwidth);
on a ring or torus fabric `ring_bidir` uses both link directions and doubles that, ask for it by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from clustersim.sim.collectives import direct, halving_doubling, hierarchical, moe_dispatch, nccl, ring, torus, tree
from clustersim.sim.collectives import nccl_algorithms as nccl_algos
from clustersim.sim.collectives.fabric import Fabric, node_groups, spans_nodes, torus_dims
from clustersim.sim.collectives.nccl_tuning import Shape
from clustersim.sim.collectives.ops import OPS
from clustersim.sim.collectives.steps import CollectiveError, Plan, Step, is_power_of_two

Algorithm = Callable[[Plan], Iterator[Step]]

ALGORITHMS: dict[str, dict[str, Algorithm]] = {
    "all_reduce": {
        "ring": ring.all_reduce,
        "ring_bidir": ring.all_reduce_bidir,
        "tree": tree.all_reduce,
        "halving_doubling": halving_doubling.all_reduce,
        "direct": direct.all_reduce,
        "hierarchical": hierarchical.all_reduce,
        "torus": torus.all_reduce,
        "nccl_ring": nccl_algos.ring_all_reduce,
        "nccl_tree": nccl_algos.tree_all_reduce,
        "nvls": nccl_algos.nvls_all_reduce,
        "nvls_tree": nccl_algos.nvls_tree_all_reduce,
    },
    "reduce_scatter": {
        "ring": ring.reduce_scatter,
        "ring_bidir": ring.reduce_scatter_bidir,
        "halving_doubling": halving_doubling.reduce_scatter,
        "direct": direct.reduce_scatter,
        "nccl_ring": nccl_algos.ring_reduce_scatter,
    },
    "all_gather": {
        "ring": ring.all_gather,
        "ring_bidir": ring.all_gather_bidir,
        "halving_doubling": halving_doubling.all_gather,
        "direct": direct.all_gather,
        "nccl_ring": nccl_algos.ring_all_gather,
    },
    "broadcast": {"ring": ring.broadcast, "tree": tree.broadcast, "direct": direct.broadcast},
    "reduce": {"ring": ring.reduce, "tree": tree.reduce, "direct": direct.reduce},
    "gather": {"tree": tree.gather, "direct": direct.gather},
    "scatter": {"tree": tree.scatter, "direct": direct.scatter},
    "all_to_all": {
        "direct": direct.all_to_all,
        "pairwise": direct.all_to_all_pairwise,
        "pxn": nccl_algos.pxn_all_to_all,
    },
    "p2p": {"direct": direct.p2p},
}

SMALL_MESSAGE_BYTES = 256 * 1024  # at or below: latency-bound, fewer steps beat fewer bytes


def auto_algorithm(op: str, fabric: Fabric, group: list[int], nbytes: float) -> str:
    """The algorithm `auto` stands for (the table in this module's docstring)."""
    n, small = len(group), nbytes <= SMALL_MESSAGE_BYTES
    if fabric.nccl is not None and op in NCCL_OPS:
        return nccl.pick(op, fabric.nccl, nccl_shape(fabric, group), nbytes)
    if op in ("p2p", "all_to_all"):
        return "direct"
    if op == "all_reduce":
        dims = torus_dims(fabric, group)
        if dims is not None and sum(d > 1 for d in dims) >= 2:
            return "torus"
        if spans_nodes(node_groups(fabric, group)):
            return "hierarchical"
        if small:
            return "halving_doubling" if is_power_of_two(n) else "tree"
        return "ring"
    if op in ("reduce_scatter", "all_gather"):
        return "halving_doubling" if small and is_power_of_two(n) else "ring"
    if op in ("broadcast", "reduce"):
        return "tree" if small else "ring"
    if op in ("gather", "scatter"):
        return "tree" if small else "direct"
    raise CollectiveError(f"unknown collective {op!r} (valid: {', '.join(OPS)})")


NCCL_OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


def nccl_shape(fabric: Fabric, group: list[int]) -> Shape:
    """The group as NCCL's tuning model sees it (nodes, ranks, one NIC per GPU of a node)."""
    assert fabric.nccl is not None
    nodes = node_groups(fabric, group) or (tuple(range(len(group))),)
    per_node = max(len(node) for node in nodes)
    return nccl.shape_of(fabric.nccl, len(nodes), len(group), fabric.nic_Bps, per_node if fabric.nic_Bps else 0)


def algorithm(op: str, name: str, fabric: Fabric, group: list[int], nbytes: float) -> tuple[str, Algorithm]:
    """(resolved name, step generator) for `op` and `name` ("auto" resolved); a miss lists the names."""
    if op not in ALGORITHMS:
        raise CollectiveError(f"unknown collective {op!r} (valid: {', '.join(OPS)})")
    if name == "auto":
        name = auto_algorithm(op, fabric, group, nbytes)
    flex = moe_dispatch.algorithm(name) if op == "all_to_all" else None
    if flex is not None:
        return name, flex
    if name not in ALGORITHMS[op]:
        raise CollectiveError(f"unknown algorithm {name!r} for {op} (valid: auto, {', '.join(ALGORITHMS[op])})")
    return name, ALGORITHMS[op][name]
