"""Collectives as algorithms over network flows that also move and reduce real numpy buffers.

Reading order: steps.py (what a step is, how real sizes map to small buffers), ops.py (what each
collective means), ring.py / tree.py / halving_doubling.py / direct.py / hierarchical.py /
torus.py (the algorithms, each with its alpha-beta cost), registry.py (ALGORITHMS and the `auto`
rule), run.py (driving steps on a Network), nccl_table.py (nccl-tests-style results); the NCCL
layer: nccl_tuning.py (NCCL's cost model and choice, from its source), nccl.py (its switches and
per-call decisions), nccl_algorithms.py (rings per rail, trees, NVLS, PXN over flows).
"""

from clustersim.sim.collectives.registry import ALGORITHMS, auto_algorithm
from clustersim.sim.collectives.run import resolve, run_collective, time_collective
from clustersim.sim.collectives.steps import CollectiveError

__all__ = ["ALGORITHMS", "CollectiveError", "auto_algorithm", "resolve", "run_collective", "time_collective"]
