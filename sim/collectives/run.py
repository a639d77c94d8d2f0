"""Run a collective on a Network: each step's messages as one transfer_many, then its data op.

    proc = env.process(run_collective(network, "all_reduce", "ring", [0, 1, 2, 3], buffers, 2**30))
    env.run(until=proc); outputs = proc.value           # one array (or None) per rank

    seconds, outputs = time_collective(graph, "all_reduce", "auto", range(8), 2**30, buffers)

A step starts when the previous one has completely landed (lockstep), so a collective takes the
sum over its steps of the slowest message of each step, as the network's max-min sharing and
path latencies make it. Times come from `nbytes` (the real size); the data from `buffers` (any
small size; None to only time it). See steps.py for how the two scales map.
"""

from __future__ import annotations

import itertools
from collections.abc import Generator, Iterable

import networkx as nx
import numpy as np
import simpy

from clustersim.sim.collectives import moe_dispatch, nccl
from clustersim.sim.collectives.fabric import Fabric, describe, node_groups, torus_dims
from clustersim.sim.collectives.ops import REDUCE_OPS, ROOTED, prepare, results
from clustersim.sim.collectives.registry import algorithm, nccl_shape
from clustersim.sim.collectives.steps import CollectiveError
from clustersim.sim.network.network import Network

# A SimPy process body running one collective: yields the network's events (SimPy sends their
# values back), returns each rank's output (None for a rank without one; None when only timing).
CollectiveProcess = Generator[simpy.Event, object, list[np.ndarray | None] | None]


def _check_group(group: Iterable[int], num_gpus: int | None) -> list[int]:
    group = [int(g) for g in group]
    if not group:
        raise CollectiveError("empty group")
    if len(set(group)) != len(group):
        raise CollectiveError(f"group {group} names a GPU twice")
    bad = [g for g in group if g < 0 or (num_gpus is not None and g >= num_gpus)]
    if bad:
        raise CollectiveError(f"group GPUs {bad} are not GPU indices 0..{(num_gpus or 0) - 1}")
    return group


def resolve(graph: nx.DiGraph, op: str, algo: str, group: Iterable[int], nbytes) -> str:
    """The algorithm name `algo` stands for on this graph ("auto" resolved; a miss raises)."""
    return resolve_protocol(graph, op, algo, group, nbytes)[0]


def resolve_protocol(graph: nx.DiGraph, op: str, algo: str, group: Iterable[int], nbytes) -> tuple[str, str]:
    """(algorithm name, NCCL protocol or "-" for a textbook algorithm) on this graph."""
    fabric = describe(graph)
    group = _check_group(group, fabric.num_gpus)
    size = _size(nbytes, len(group))
    name = algorithm(op, algo, fabric, group, size)[0]
    tuned = _tune(fabric, op, name, group, size)
    return name, tuned.protocol if tuned else "-"


def _tune(fabric: Fabric, op: str, name: str, group: list[int], size: float) -> nccl.Tuned | None:
    """The NCCL layer's decisions for an NCCL algorithm on a fabric that has the layer on (a flex
    MoE exchange: a point-to-point one's, "pxn")."""
    if moe_dispatch.parse(name) is not None:
        name = "pxn"
    if name not in nccl.ALGOS or fabric.nccl is None:
        return None
    node_of = fabric.node_of_gpu
    rails = [gpu - node_of.index(node_of[gpu]) for gpu in group] if node_of else list(range(len(group)))
    return nccl.tune(op, name, fabric.nccl, nccl_shape(fabric, group), size, fabric.nic_Bps, rails)


def _size(nbytes, n: int) -> float:
    """nccl-tests' size: the number itself, or for an all_to_all bytes matrix its mean row sum."""
    return float(np.sum(nbytes) / n) if np.ndim(nbytes) else float(nbytes)


def run_collective(
    network: Network,
    op: str,
    algo: str,
    group: Iterable[int],
    buffers: list | None,
    nbytes,
    reduce_op: str = "sum",
    *,
    root: int = 0,
    counts=None,
    label: str | None = None,
    graph: nx.DiGraph | None = None,
) -> CollectiveProcess:
    """A SimPy process body running `op` with `algo` over the GPUs `group` (rank r = group[r]).

    `nbytes`: the real size (nccl-tests' meaning; for all_to_all also an (n, n) bytes matrix).
    `buffers`: one array per rank (see ops.py for each op's inputs), or None to only time it.
    `counts`: all_to_all's (n, n) element counts for uneven pieces. The process returns each
    rank's output (None when buffers is None). Bad names or groups raise CollectiveError here,
    before anything is scheduled. `graph` (default: network.graph, if the network keeps one) is
    the topology that `auto`, hierarchical and torus read; without one the fabric counts as flat.
    """
    group, name, plan, work, steps = _start(
        graph if graph is not None else getattr(network, "graph", None),
        op,
        algo,
        group,
        buffers,
        nbytes,
        reduce_op,
        root,
        counts,
    )
    return _drive(
        network, np.array(group), steps, work, REDUCE_OPS[reduce_op], label or f"{op}:{name}", op, plan, buffers
    )


def apply_collective(
    graph: nx.DiGraph | None,
    op: str,
    algo: str,
    group: Iterable[int],
    buffers: list,
    nbytes,
    reduce_op: str = "sum",
    *,
    root: int = 0,
    counts=None,
) -> list:
    """The outputs `run_collective` would give, without a network: the same algorithm's steps
    applied to the buffers in the same order (so the same bits), for a collective timed elsewhere."""
    _, _, plan, work, steps = _start(graph, op, algo, group, buffers, nbytes, reduce_op, root, counts)
    for step in steps:
        step.apply(work, REDUCE_OPS[reduce_op])
    return results(op, plan, work, buffers)


def _start(graph, op, algo, group, buffers, nbytes, reduce_op, root, counts):
    """(group, algorithm name, plan, work buffers, steps) with every check done up front."""
    fabric = describe(graph)
    group = _check_group(group, fabric.num_gpus)
    if reduce_op not in REDUCE_OPS:
        raise CollectiveError(f"unknown reduction {reduce_op!r} (valid: {', '.join(REDUCE_OPS)})")
    n = len(group)
    name, steps_of = algorithm(op, algo, fabric, group, _size(nbytes, n))
    tuned = _tune(fabric, op, name, group, _size(nbytes, n))
    plan, work = prepare(
        op,
        n,
        nbytes,
        buffers,
        root if op in ROOTED else 0,
        counts,
        nodes=node_groups(fabric, group),
        dims=torus_dims(fabric, group),
        nccl=tuned,
    )
    steps = steps_of(plan)
    first = next(steps, None)  # runs the algorithm's own checks now, outside the event loop
    return group, name, plan, work, itertools.chain([first] if first is not None else [], steps)


def _drive(network, gpu, steps, work, ufunc, label, op, plan, buffers) -> CollectiveProcess:
    for step in steps:
        if len(step.src):
            yield from _step_latency(network, gpu[step.src[[0, -1]]], gpu[step.dst[[0, -1]]], step.latency_s)
            yield network.transfer_many(gpu[step.src], gpu[step.dst], step.nbytes, label)
        if work is not None:
            step.apply(work, ufunc)
    return None if work is None else results(op, plan, work, buffers)


def _step_latency(network: Network, src, dst, latency_s: float) -> Generator:
    """An NCCL step's protocol latency beyond the path latency its messages pay anyway (a wait
    before they start; a textbook step has none). `src`, `dst`: the step's first and last
    messages, which the NCCL layer orders NVLink hops first and NIC hops last, so the longer of
    the two paths stands for the step's."""
    if latency_s > 0:
        path_s = max(network.routes.path_latency(int(a), int(b)) for a, b in zip(src, dst))
        if latency_s > path_s:
            yield network.env.timeout(latency_s - path_s)


def step_pairs(
    graph: nx.DiGraph | None, op: str, algo: str, group: Iterable[int], nbytes
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(sources, destinations) of each step's messages, as GPU indices: which routes the
    collective will use, step by step, known without running it."""
    group, _, _, _, steps = _start(graph, op, algo, group, None, nbytes, "sum", 0, None)
    gpu = np.array(group)
    return [(gpu[step.src], gpu[step.dst]) for step in steps]


def message_pairs(
    graph: nx.DiGraph | None, op: str, algo: str, group: Iterable[int], nbytes
) -> tuple[np.ndarray, np.ndarray]:
    """(sources, destinations) of every message the collective sends, over all its steps."""
    pairs = step_pairs(graph, op, algo, group, nbytes)
    return (
        np.concatenate([src for src, _ in pairs]) if pairs else np.zeros(0, np.int64),
        np.concatenate([dst for _, dst in pairs]) if pairs else np.zeros(0, np.int64),
    )


def run_images(
    network: Network, op: str, algo: str, groups: list[tuple[int, ...]], nbytes, label: str | None = None
) -> Generator:
    """A SimPy process body timing `op` on several disjoint groups that are images of one another
    (sim.symmetry: groups[k][i] is the image of groups[0][i]), step by step together: step i of
    every group goes out as one transfer. Each image takes the same time per step as the others,
    so this is running them apart at the cost of one re-share per step instead of one per group
    and step. The steps are planned once, on the first group, and moved onto the others."""
    group, name, _, _, steps = _start(
        getattr(network, "graph", None), op, algo, groups[0], None, nbytes, "sum", 0, None
    )
    gpus = np.array(groups)  # (images, members)
    for step in steps:
        if len(step.src):
            yield from _step_latency(network, gpus[0, step.src[[0, -1]]], gpus[0, step.dst[[0, -1]]], step.latency_s)
            yield network.transfer_many(
                gpus[:, step.src].ravel(),
                gpus[:, step.dst].ravel(),
                np.tile(step.nbytes, len(gpus)),
                label or f"{op}:{name}",
            )


def time_collective(
    graph: nx.DiGraph,
    op: str,
    algo: str,
    group: Iterable[int] | None,
    nbytes,
    buffers: list | None = None,
    reduce_op: str = "sum",
    **options,
) -> tuple[float, list | None]:
    """(simulated seconds, outputs) of one collective alone on a fresh network over `graph`.
    `group` None means every GPU; `options` are run_collective's keywords (root, counts)."""
    env = simpy.Environment()
    network = Network(env, graph)
    if group is None:
        num_gpus = describe(graph).num_gpus
        if num_gpus is None:
            raise CollectiveError("time_collective: every GPU of no graph (group None needs a topology graph)")
        group = range(num_gpus)
    process = env.process(run_collective(network, op, algo, group, buffers, nbytes, reduce_op, graph=graph, **options))
    env.run(until=process)
    return env.now, process.value
