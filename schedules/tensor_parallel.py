"""Tensor (and sequence) parallelism as a pass over a pipeline Program: the tensor-parallel
group's collectives after each forward and backward, on each rank's "tp" stream.

Megatron (Shoeybi et al. 2019) splits a layer's attention and MLP column- then row-wise over the
t ranks of a tensor-parallel group: each forward ends its attention and its MLP with an
all-reduce of the (s, b, h) activation (operator g), each backward does the same for the input
gradients (operator f): 2 all-reduces per layer each way. Sequence parallelism (Korthikanti et
al. 2022) turns each all-reduce into a reduce-scatter after and an all-gather before the
sequence-split regions: the same bytes on the wire, activations split t ways in between.

Ops here cover a whole stage (all of its L layers), so a stage's forward or backward is
followed by one collective of the 2L layers' bytes (with sequence parallelism one
reduce-scatter and one all-gather of them), and everything that uses the result waits for it.
Megatron's tensor-parallel collectives block the compute stream, so for a group in lockstep the
time per stage op is the same as interleaving them layer by layer (ring all-reduce time is
linear in the bytes), except that the latency term is paid once instead of 2L times.
"""

from __future__ import annotations

import dataclasses

from schedules.ir import Collective, Compute, Op, Program
from schedules.layout import Layout

TP_STREAM = "tp"


def add_tensor_parallel(program: Program, layout: Layout, layers_per_stage: int, activation_bytes: float,
                        sequence_parallel: bool) -> Program:
    """The program with each forward's and backward's tensor-parallel collectives added.

    `activation_bytes`: one layer's (s, b, h) activation in bytes, what one all-reduce moves.
    With tp = 1 there is nothing to add and the program is returned as it is.
    """
    if layout.tp == 1:
        return program
    kinds = ("reduce_scatter", "all_gather") if sequence_parallel else ("all_reduce",)
    nbytes = 2 * layers_per_stage * activation_bytes
    ops: dict[int, list[Op]] = {}
    for rank in program.ranks:
        d, p, _ = layout.coords(rank)
        group = layout.tp_group(d, p)
        finished_by: dict[str, str] = {}  # compute label -> the last collective completing its result
        out: list[Op] = []
        last = None  # the previous compute's last collective: the next compute waits for it
        for op in program.ops[rank]:
            extra = tuple(finished_by[dep] for dep in op.deps if dep in finished_by)
            if isinstance(op, Compute) and last is not None:
                extra += (last,)
            op = dataclasses.replace(op, deps=op.deps + extra) if extra else op
            out.append(op)
            if isinstance(op, Compute) and op.phase in ("F", "B"):
                prev = op.label
                for kind in kinds:
                    collective = Collective(kind, f"tp@d{d}.{op.label}.{kind}", group, nbytes, stream=TP_STREAM,
                                            deps=(prev,))
                    out.append(collective)
                    prev = collective.label
                finished_by[op.label] = last = prev
        ops[rank] = out
    return Program(ops, program.num_stages, program.num_microbatches, program.stage_to_rank, program.replicas)
