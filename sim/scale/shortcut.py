"""Collectives timed once and replayed: the exact time at a fraction of the cost, where it is exact.

A collective's time depends only on the flows sharing its links. If the links a process group's
collectives use carry nothing else during the whole run (no other group's collectives, no
point-to-point message), and the group's collectives come from one stream per member (so they
never overlap each other), every collective of that group with the same kind, algorithm and size
takes exactly what it takes alone on an idle network. Tensor-parallel groups inside an NVSwitch
node are the common case: thousands of identical collectives per step, on links nobody else uses.

`Shortcuts` decides this once per program from the routes (which links each group's collectives'
messages and each point-to-point pair would use) and keeps one `Recording` per (kind, algorithm, GPUs,
size): the collective run alone on a fresh copy of the network. The engine waits the recorded
duration and the network replays the recorded link statistics and messages at the real start
time, so reports and pictures are the same as the exact path's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping

import networkx as nx
import numpy as np
import simpy

from clustersim.schedules.ir import Collective, Program, Send
from clustersim.sim.collectives.run import message_pairs, run_collective, run_images
from clustersim.sim.network.ledger import Recording
from clustersim.sim.network.network import Network
from clustersim.sim.scale.symmetry import Symmetry
from clustersim.topologies.routing import Router


class Shortcuts:
    """Which process groups' collectives may be replayed on a network over `graph`, and their
    recordings."""

    def __init__(
        self,
        program: Program,
        graph: nx.DiGraph,
        router: Router,
        rank_to_gpu: Mapping[int, int] | None = None,
        symmetry: Symmetry | None = None,
    ):
        """`router`: the network's (its routes decide which links a group uses); `rank_to_gpu`:
        default, ranks are GPUs. `symmetry`: the program's ranks are representatives whose images
        run alongside; their groups and messages count too (ranks are GPUs then)."""
        gpu_of: Callable[[int], int] = (lambda rank: rank) if rank_to_gpu is None else rank_to_gpu.__getitem__
        self._recordings: dict[tuple, Recording] = {}
        variants: dict[tuple[int, ...], set[tuple[str, str, float]]] = defaultdict(set)
        streams: dict[tuple[int, ...], set[str]] = defaultdict(set)
        pairs: set[tuple[int, int]] = set()
        # each distinct collective of the program: (group, kind, algorithm, bytes, stream)
        self.collectives = {
            (op.group, op.kind, op.algorithm, op.nbytes, op.stream)
            for ops in program.ops.values()
            for op in ops
            if type(op) is Collective
        }
        for group, kind, algorithm, nbytes, stream in self.collectives:
            gpus = tuple(gpu_of(r) for r in group)
            for image in symmetry.groups(gpus) if symmetry is not None else [gpus]:
                variants[image].add((kind, algorithm, nbytes))
                streams[image].add(stream)
        sends = {
            (rank, op.peer) for rank, ops in program.ops.items() for op in ops if type(op) is Send and op.nbytes > 0
        }
        for rank, peer in sends:
            src, dst = gpu_of(rank), gpu_of(peer)
            pairs.update(zip(*symmetry.pairs(src, dst)) if symmetry is not None else [(src, dst)])
        owners = np.zeros(graph.number_of_edges(), dtype=np.int64)  # how many traffic classes use each link
        group_links: dict[tuple[int, ...], np.ndarray] = {}
        for gpus, kinds in variants.items():
            sources, destinations = zip(*(message_pairs(graph, kind, algo, gpus, size) for kind, algo, size in kinds))
            group_src, group_dst = np.concatenate(sources), np.concatenate(destinations)
            routed = group_src != group_dst
            group_links[gpus] = np.unique(router.route_many(group_src[routed], group_dst[routed])[1])
            owners[group_links[gpus]] += 1
        if pairs:
            pair_src, pair_dst = (np.array(side, dtype=np.int64) for side in zip(*sorted(pairs)))
            routed = pair_src != pair_dst
            _, links = router.route_many(pair_src[routed], pair_dst[routed])
            owners[np.unique(links)] += 1
        self.groups = {
            gpus for gpus, links in group_links.items() if len(streams[gpus]) == 1 and (owners[links] == 1).all()
        }

    def recording(
        self, network: Network, kind: str, algorithm: str, groups: tuple[tuple[int, ...], ...], nbytes: float
    ) -> Recording:
        """The collective run alone on an idle copy of `network`, from t = 0, on each of `groups`
        at once: one group, or a group and its images (sim.scale.symmetry), whose links are disjoint, so
        together each runs as alone and one replay stands for all (made once)."""
        key = (kind, algorithm, groups, nbytes)
        if key not in self._recordings:
            env = simpy.Environment()
            alone = network.fresh(env)
            env.run(
                env.process(
                    run_collective(alone, kind, algorithm, list(groups[0]), None, nbytes, label="")
                    if len(groups) == 1
                    else run_images(alone, kind, algorithm, list(groups), nbytes, label="")
                )
            )
            self._recordings[key] = alone.recording()
        return self._recordings[key]

    def replays(self, images: list[tuple[int, ...]]) -> bool:
        """Whether a collective on a group and its images (sim.scale.symmetry; or the group alone) is
        replayed: every one of them has its links to itself."""
        return all(gpus in self.groups for gpus in images)
