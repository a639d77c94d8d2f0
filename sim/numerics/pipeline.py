"""What the engine calls to really run a pipeline schedule's math on the shadow model.

Each rank has a store `tag -> array`, tag = (phase "F"|"B", microbatch, producer stage): forward
F{j}@{s} is stage s's output activation for microbatch j, B{j}@{s} the gradient w.r.t. stage s's
input. Compute ops read their input from the store (popping it, so it is used once) and write
their output to it; sends read the store, receives write it. A schedule that reads a tensor
before it was produced or delivered fails with the rank, the op and the missing tensor.
`finish` compares the updated weights with the single-device reference.
"""

from __future__ import annotations

import numpy as np

from sim.numerics.optim import make_optimizer
from sim.numerics.reference import reference_step
from sim.numerics.stages import StageModel
from sim.numerics.transformer import ShadowConfig, init_params

DATA_STREAM = 1  # data come from default_rng([seed, DATA_STREAM]); parameters from default_rng(seed)


def make_batch(cfg: ShadowConfig, seed: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic random token sequences and their next-token targets, each (rows, seq_len)."""
    seq = np.random.default_rng([seed, DATA_STREAM]).integers(0, cfg.vocab, size=(rows, cfg.seq_len + 1))
    return seq[:, :-1].copy(), seq[:, 1:].copy()  # (rows, s), (rows, s)


def _tag_text(tag) -> str:
    phase, mb, stage = tag
    return f"{phase}{mb}@{stage}"


def max_errors(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> tuple[float, float]:
    """(max_abs_err, max_rel_err) over the names in `got`:

        max_abs_err = max_name max_i |a_i - b_i|
        max_rel_err = max_name max_i |a_i - b_i| / max(max_i |b_i|, tiny)

    with a = got[name], b = want[name] and tiny the dtype's smallest normal number, i.e. each
    tensor's worst error relative to that tensor's largest reference entry."""
    abs_err = rel_err = 0.0
    for name, a in got.items():
        b = want[name]
        err = float(np.max(np.abs(a - b))) if np.isfinite(a).all() else np.inf
        abs_err = max(abs_err, err)
        rel_err = max(rel_err, err / max(float(np.max(np.abs(b))), float(np.finfo(b.dtype).tiny)))
    return abs_err, rel_err


class PipelineNumerics:
    """Shadow-model numerics for one training step of a pipeline-parallel schedule."""

    def __init__(self, cfg: ShadowConfig, num_stages: int, num_microbatches: int, micro_batch_size: int,
                 stage_to_rank: dict[int, int], seed: int, optimizer: str = "adam", lr: float = 1e-3,
                 data: tuple[np.ndarray, np.ndarray] | None = None, recompute_full: bool = False):
        """`data`: (tokens, targets), each (num_microbatches x micro_batch_size, seq_len), when the
        batch is a slice of a larger one (a data-parallel replica's); default: drawn from `seed`."""
        if num_microbatches < 1 or micro_batch_size < 1:
            raise ValueError(f"num_microbatches ({num_microbatches}) and micro_batch_size ({micro_batch_size}) "
                             "must be >= 1")
        if set(stage_to_rank) != set(range(num_stages)):
            raise ValueError(f"stage_to_rank covers stages {sorted(stage_to_rank)}, "
                             f"expected 0..{num_stages - 1}")
        self.cfg = cfg
        self.num_stages = num_stages
        self.num_microbatches = num_microbatches
        self.micro_batch_size = micro_batch_size
        self.stage_to_rank = dict(stage_to_rank)
        self.seed = seed
        self.optimizer = optimizer
        self.lr = lr
        self.tokens, self.targets = data or make_batch(cfg, seed, num_microbatches * micro_batch_size)  # (m*b, s)
        params = init_params(cfg, seed)
        self.stages = [StageModel(cfg, s, num_stages, params, num_microbatches, recompute_full)
                       for s in range(num_stages)]
        self.optimizers = [make_optimizer(optimizer, lr) for _ in range(num_stages)]
        self.stepped: set[int] = set()
        self.store: dict[int, dict[tuple, np.ndarray]] = {rank: {} for rank in sorted(set(stage_to_rank.values()))}

    def _microbatch(self, data: np.ndarray, mb: int) -> np.ndarray:
        b = self.micro_batch_size
        return data[mb * b:(mb + 1) * b]  # (b, s)

    def _rank_store(self, rank: int) -> dict[tuple, np.ndarray]:
        if rank not in self.store:
            raise RuntimeError(f"rank {rank} holds no pipeline stage (stage_to_rank: {self.stage_to_rank})")
        return self.store[rank]

    def _take(self, rank: int, op, tag, what: str) -> np.ndarray:
        store = self._rank_store(rank)
        if tag not in store:
            raise RuntimeError(f"rank {rank}, {op.label}: {what} {_tag_text(tag)} used before it arrived")
        return store.pop(tag)

    def run_compute(self, rank: int, op) -> None:
        """Run F, B or OPT of `op.stage` (for `op.microbatch`) on `rank`'s store."""
        s, mb = op.stage, op.microbatch
        if self.stage_to_rank.get(s) != rank:
            raise RuntimeError(f"rank {rank}, {op.label}: stage {s} lives on rank {self.stage_to_rank.get(s)}")
        stage = self.stages[s]
        store = self._rank_store(rank)
        if op.phase == "F":
            if stage.is_first:
                inp = self._microbatch(self.tokens, mb)  # (b, s)
            else:
                inp = self._take(rank, op, ("F", mb, s - 1), "activation")  # (b, s, h)
            out = stage.forward(mb, inp, self._microbatch(self.targets, mb) if stage.is_last else None)
            if not stage.is_last:
                store[("F", mb, s)] = out  # (b, s, h)
        elif op.phase == "B":
            dout = None if stage.is_last else self._take(rank, op, ("B", mb, s + 1), "gradient")  # (b, s, h)
            dinp = stage.backward(mb, dout)
            if not stage.is_first:
                store[("B", mb, s)] = dinp  # (b, s, h)
        elif op.phase == "OPT":
            self._step(rank, op, s)
        else:
            raise RuntimeError(f"rank {rank}, {op.label}: unknown phase {op.phase!r}")

    def _step(self, rank: int, op, s: int) -> None:
        stage = self.stages[s]
        if s in self.stepped:
            raise RuntimeError(f"rank {rank}, {op.label}: stage {s} took its optimizer step twice")
        if missing := stage.missing_backward():
            raise RuntimeError(f"rank {rank}, {op.label}: optimizer step before the backward of microbatches {missing}")
        self.optimizers[s].step(stage.params, stage.grads)
        self.stepped.add(s)

    def send_payload(self, rank: int, op) -> np.ndarray:
        """The array `op` (a Send) carries; it stays in the sender's store."""
        store = self._rank_store(rank)
        if op.tag not in store:
            raise RuntimeError(f"rank {rank}, {op.label}: {_tag_text(op.tag)} sent before it was computed")
        return store[op.tag]

    def receive(self, rank: int, op, payload: np.ndarray) -> None:
        """Deliver `payload` for `op` (a Recv) into `rank`'s store."""
        store = self._rank_store(rank)
        if op.tag in store:
            raise RuntimeError(f"rank {rank}, {op.label}: {_tag_text(op.tag)} received while an unused copy is held")
        store[op.tag] = payload

    def finish(self) -> dict:
        """Check the step completed, run the reference on the same data and compare.

        Returns max_abs_err / max_rel_err of the updated parameters (see `max_errors`),
        max_grad_rel_err of the accumulated gradients, the pipeline's loss (mean over
        microbatches), the reference's loss and the number of parameter tensors compared."""
        if missing := [s for s in range(self.num_stages) if s not in self.stepped]:
            raise RuntimeError(f"stages {missing} never took their optimizer step")
        for stage in self.stages:
            if held := stage.pending_microbatches():
                raise RuntimeError(f"stage {stage.stage}: caches of microbatches {held} were never freed")
        ref = reference_step(self.cfg, init_params(self.cfg, self.seed), self.tokens, self.targets,
                             self.optimizer, self.lr)
        params = {name: value for stage in self.stages for name, value in stage.params.items()}
        grads = {name: value for stage in self.stages for name, value in stage.grads.items()}
        if set(params) != set(ref.params):
            raise RuntimeError(f"stages hold parameters {sorted(set(params) ^ set(ref.params))} "
                               "differently from the reference model")
        max_abs, max_rel = max_errors(params, ref.params)
        _, grad_rel = max_errors(grads, ref.grads)
        losses = self.stages[-1].losses
        return {
            "max_abs_err": max_abs,
            "max_rel_err": max_rel,
            "max_grad_rel_err": grad_rel,
            "loss": float(np.mean([losses[mb] for mb in range(self.num_microbatches)])),
            "reference_loss": ref.loss,
            "params_compared": len(params),
        }
