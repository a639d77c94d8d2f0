"""What a numerics run is asked to do: the training step (its batch, seed and optimizer) and how
each pipeline's model is split beyond stages (tensor, sequence and expert parallelism), as two
small frozen objects instead of a dozen positional parameters."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from clustersim.sim.numerics.transformer import ShadowConfig

DATA_STREAM = 1  # data come from default_rng([seed, DATA_STREAM]); parameters from default_rng(seed)


@dataclass(frozen=True)
class TrainingStep:
    """One optimizer step over `num_microbatches` microbatches of `micro_batch_size` rows (per
    pipeline); `seed` draws the weights and the data; `recompute_full` keeps only each
    microbatch's input and runs its forward again in the backward; `split_backward`: the
    (microbatch, stage) pairs whose backward the schedule splits into B (input gradient) and W
    (weight gradient, accumulated only when W runs)."""

    num_microbatches: int
    micro_batch_size: int
    seed: int
    optimizer: str = "adam"
    lr: float = 1e-3
    recompute_full: bool = False
    split_backward: frozenset[tuple[int, int]] = frozenset()

    def __post_init__(self) -> None:
        if self.num_microbatches < 1 or self.micro_batch_size < 1:
            raise ValueError(
                f"num_microbatches ({self.num_microbatches}) and micro_batch_size ({self.micro_batch_size}) "
                "must be >= 1"
            )

    @property
    def rows(self) -> int:
        """Rows of one pipeline's batch: m x b."""
        return self.num_microbatches * self.micro_batch_size


@dataclass(frozen=True)
class Sharding:
    """A pipeline's place in its tensor-parallel group (`tp_rank` of `tp`, sequence parallel or
    not) and in its MoE layers' expert-parallel groups (`ep_rank` of `ep`); `unit_layers`: ZeRO 3
    gathers each stage's weights in units of that many layers (schedules.zero3), None: whole;
    `scatter_gather`: each rank sends 1/t of a pipeline message (Megatron's scatter/gather)."""

    tp: int = 1
    sequence_parallel: bool = False
    ep: int = 1
    tp_rank: int = 0
    ep_rank: int = 0
    unit_layers: int | None = None
    scatter_gather: bool = False  # pipeline messages travel as t chunks, all-gathered on receipt
    tp_comm_overlap: bool = False  # a GEMM piece may run beside the collective it waits for (schedules.tp_overlap)

    def at(self, tp_rank: int, ep_rank: int) -> Sharding:
        """The same split, at another place in the groups."""
        return dataclasses.replace(self, tp_rank=tp_rank, ep_rank=ep_rank)

    @property
    def in_pieces(self) -> bool:
        """Whether stage ops run in pieces cut at tensor- or expert-parallel collectives, or at
        ZeRO-3 units."""
        return self.tp > 1 or self.ep > 1 or self.unit_layers is not None


UNSHARDED = Sharding()  # no tensor or expert parallelism: every pipeline holds whole stages


def make_batch(cfg: ShadowConfig, seed: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic random token sequences and their next-token targets, each (rows, seq_len)."""
    seq = np.random.default_rng([seed, DATA_STREAM]).integers(0, cfg.vocab, size=(rows, cfg.seq_len + 1))
    return seq[:, :-1].copy(), seq[:, 1:].copy()  # (rows, s), (rows, s)
