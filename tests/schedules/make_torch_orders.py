"""Write the fixtures tests/schedules/torch_orders/*.json: the compute order each pipeline rank
executes under PyTorch's torch.distributed.pipelining runtime, so the tests can compare our
generators with it without torch installed.

    python tests/schedules/make_torch_orders.py      # needs torch (any CPU build); no GPU, no process group

Each schedule class is built on stand-in stages (the attributes its constructor reads: stage
index, number of stages, group size and rank, no module), which lowers its compute table to the
runtime's action list (`_prepare_schedule_with_comms`: send/recv, unshard, reduce-grad actions
added). The fixture is what `_PipelineScheduleRuntime._step_microbatches` walks: that list in order,
an OVERLAP_F_B expanded into its sub-actions in their order (the runtime performs them one after
the other), keeping the compute actions. Phases map to ours: F -> F, I (input gradient) -> B,
B (full backward) -> B, W -> W; the stage is the global stage index.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.distributed.pipelining import schedules as ts

OUT = Path(__file__).with_name("torch_orders")
PHASE = {"F": "F", "I": "B", "B": "B", "W": "W"}

# our schedule name -> (PyTorch class, stage placement style, (pp, virtual, microbatches) shapes)
CASES = {
    "interleaved-zb": (ts.ScheduleInterleavedZeroBubble, "loop", [(2, 2, 4), (4, 2, 8), (4, 3, 12), (3, 2, 9)]),
    "zb-h1": (ts.ScheduleInterleavedZeroBubble, "loop", [(2, 1, 4), (4, 1, 8), (4, 1, 6), (8, 1, 16)]),
    "zbv": (ts.ScheduleZBVZeroBubble, "v", [(2, 2, 4), (4, 2, 8), (4, 2, 5), (3, 2, 12)]),
    "dualpipev": (ts.ScheduleDualPipeV, "v", [(2, 2, 4), (4, 2, 8), (4, 2, 12), (3, 2, 10)]),
    "looped-bfs": (ts.ScheduleLoopedBFS, "loop", [(2, 2, 4), (4, 2, 8), (4, 3, 5), (3, 1, 4)]),
}


def stand_in_stages(pp: int, virtual: int, rank: int, style: str) -> list[SimpleNamespace]:
    """What the schedule constructors read of rank `rank`'s stages."""
    num_stages = pp * virtual
    placement = ts.generate_stage_to_rank_mapping(pp, num_stages, style=style)
    return [
        SimpleNamespace(
            stage_index=s,
            num_stages=num_stages,
            group_size=pp,
            group_rank=rank,
            is_first=s == 0,
            is_last=s == num_stages - 1,
            submod=None,
        )
        for s in sorted(s for s, r in placement.items() if r == rank)
    ]


def compute_steps(actions) -> list[list]:
    """[[phase, microbatch, stage], ...] of the compute actions, an OVERLAP_F_B's sub-actions in order."""
    flat = [sub for action in actions if action is not None for sub in (action.sub_actions or (action,))]
    return [
        [PHASE[a.computation_type.value], a.microbatch_index, a.stage_index]
        for a in flat
        if a.computation_type.value in PHASE
    ]


def executed_order(cls, pp: int, virtual: int, m: int, style: str) -> tuple[dict[str, list[list]], list[int]]:
    """rank -> [[phase, microbatch, stage], ...] in the order the runtime performs them, and the
    ranks whose compute table (`pipeline_order`) lists a different order (none, for torch 2.15)."""
    order, differs = {}, []
    for rank in range(pp):
        schedule = cls(stand_in_stages(pp, virtual, rank, style), m)
        order[str(rank)] = compute_steps(schedule.pipeline_order_with_comms[rank])
        if compute_steps(schedule.pipeline_order[rank]) != order[str(rank)]:
            differs.append(rank)
    return order, differs


def main() -> int:
    OUT.mkdir(exist_ok=True)
    for name, (cls, style, shapes) in CASES.items():
        fixture = {
            "source": f"torch {torch.__version__}, torch.distributed.pipelining.schedules.{cls.__name__}",
            "shapes": [
                {"pp": pp, "virtual": v, "microbatches": m, "ranks": ranks, "table_differs_on_ranks": differs}
                for pp, v, m in shapes
                for ranks, differs in [executed_order(cls, pp, v, m, style)]
            ],
        }
        (OUT / f"{name}.json").write_text(json.dumps(fixture, indent=None, separators=(",", ":")) + "\n")
        print(f"wrote {OUT / name}.json ({len(shapes)} shapes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
