"""Readable views of a Program's compute order: a step x rank text grid and a JSON listing."""

from __future__ import annotations

from clustersim.schedules.ir import Compute, Phase, Program


def compute_grid(program: Program) -> str:
    """Each rank's compute order as a text grid: one row per rank, one column per step."""
    rows = []
    for rank in program.ranks:
        cells = [op.label for op in program.ops[rank] if isinstance(op, Compute) and op.phase != Phase.OPT]
        rows.append((f"rank {rank}", cells))
    width = max((len(c) for _, cells in rows for c in cells), default=1)
    head = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{head}} | " + " ".join(f"{c:<{width}}" for c in cells).rstrip() for name, cells in rows)


def compute_order_json(program: Program) -> dict:
    """`{"ranks": {"0": [{"phase": "F", "microbatch": 0, "stage": 0}, ...]}}` in execution order."""
    return {
        "ranks": {
            str(rank): [
                {"phase": op.phase, "microbatch": op.microbatch, "stage": op.stage}
                for op in program.ops[rank]
                if isinstance(op, Compute) and op.phase != Phase.OPT
            ]
            for rank in program.ranks
        }
    }
