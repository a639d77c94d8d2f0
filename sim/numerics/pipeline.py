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

from clustersim.sim.numerics.moe import routing_summary
from clustersim.sim.numerics.optim import make_optimizer
from clustersim.sim.numerics.reference import reference_step
from clustersim.sim.numerics.stages import StageModel
from clustersim.sim.numerics.tensor_parallel import TensorParallelStage
from clustersim.sim.numerics.transformer import ShadowConfig, init_params

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


def _is_grad_sync(op) -> bool:
    """The tensor-parallel sum of replicated gradients before the step (tag tp@d{d}.grads@{stage})."""
    return ".grads@" in op.tag


class PipelineNumerics:
    """Shadow-model numerics for one training step of a pipeline-parallel schedule."""

    def __init__(
        self,
        cfg: ShadowConfig,
        num_stages: int,
        num_microbatches: int,
        micro_batch_size: int,
        stage_to_rank: dict[int, int],
        seed: int,
        optimizer: str = "adam",
        lr: float = 1e-3,
        data: tuple[np.ndarray, np.ndarray] | None = None,
        recompute_full: bool = False,
        tp: int = 1,
        tp_rank: int = 0,
        sequence_parallel: bool = False,
        ep: int = 1,
        ep_rank: int = 0,
    ):
        """`data`: (tokens, targets), each (num_microbatches x micro_batch_size, seq_len), when the
        batch is a slice of a larger one (a data-parallel replica's); default: drawn from `seed`.
        With `tp` > 1 this pipeline is tensor-parallel rank `tp_rank` of its group: its stages hold
        that rank's shards, and each forward and backward runs piece by piece (ops with `part`),
        its tensor-parallel collectives (on the "tp" stream) carrying the pieces' partial results.
        With `ep` > 1 it is expert-parallel rank `ep_rank` of its MoE layers' groups: it holds
        that rank's experts, and its tokens travel to them by all_to_all (on the "ep" stream)."""
        if num_microbatches < 1 or micro_batch_size < 1:
            raise ValueError(
                f"num_microbatches ({num_microbatches}) and micro_batch_size ({micro_batch_size}) must be >= 1"
            )
        if set(stage_to_rank) != set(range(num_stages)):
            raise ValueError(f"stage_to_rank covers stages {sorted(stage_to_rank)}, expected 0..{num_stages - 1}")
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
        self.tp = tp
        self.in_pieces = tp > 1 or ep > 1  # stages run as generators that yield their collectives
        if self.in_pieces:
            self.stages = [
                TensorParallelStage(
                    cfg,
                    s,
                    num_stages,
                    params,
                    num_microbatches,
                    tp,
                    tp_rank,
                    sequence_parallel,
                    recompute_full,
                    ep=ep,
                    ep_rank=ep_rank,
                )
                for s in range(num_stages)
            ]
        else:
            self.stages = [
                StageModel(cfg, s, num_stages, params, num_microbatches, recompute_full) for s in range(num_stages)
            ]
        self.running: dict[int, tuple[str, object, tuple]] = {}  # rank -> (op label, generator, its request)
        self.answers: dict[int, np.ndarray] = {}  # rank -> the collective result its next piece resumes with
        self.syncs: dict[tuple[int, str], object] = {}  # (rank, tag) -> a gradient sum waiting for its result
        self.optimizers = [make_optimizer(optimizer, lr) for _ in range(num_stages)]
        self.stepped: set[int] = set()
        self.store: dict[int, dict[tuple, np.ndarray]] = {rank: {} for rank in sorted(set(stage_to_rank.values()))}

    def _microbatch(self, data: np.ndarray, mb: int) -> np.ndarray:
        b = self.micro_batch_size
        return data[mb * b : (mb + 1) * b]  # (b, s)

    def _rank_store(self, rank: int) -> dict[tuple, np.ndarray]:
        if rank not in self.store:
            raise RuntimeError(f"rank {rank} holds no pipeline stage (stage_to_rank: {self.stage_to_rank})")
        return self.store[rank]

    def _take(self, rank: int, op, tag, what: str) -> np.ndarray:
        store = self._rank_store(rank)
        if tag not in store:
            raise RuntimeError(f"rank {rank}, {op.label}: {what} {_tag_text(tag)} used before it arrived")
        return store.pop(tag)

    def run_compute(self, rank: int, op) -> bool:
        """Run F, B or OPT of `op.stage` (for `op.microbatch`) on `rank`'s store; for a piece of a
        tensor-parallel op, run the op up to its next collective. True when the whole op is done."""
        s, mb = op.stage, op.microbatch
        if self.stage_to_rank.get(s) != rank:
            raise RuntimeError(f"rank {rank}, {op.label}: stage {s} lives on rank {self.stage_to_rank.get(s)}")
        if op.part is not None and not self.in_pieces:
            raise RuntimeError(
                f"rank {rank}, {op.label}: a piece, but this pipeline has no tensor- or expert-"
                "parallel collective to cut its ops at"
            )
        if op.part:
            return self._resume(rank, op, self.answers.pop(rank, None))
        stage = self.stages[s]
        if op.phase == "F":
            if stage.is_first:
                inp = self._microbatch(self.tokens, mb)  # (b, s)
            else:
                inp = self._take(rank, op, ("F", mb, s - 1), "activation")  # (b, s, h) or its sequence chunk
            run = stage.forward(mb, inp, self._microbatch(self.targets, mb) if stage.is_last else None)
        elif op.phase == "B":
            dout = None if stage.is_last else self._take(rank, op, ("B", mb, s + 1), "gradient")
            run = stage.backward(mb, dout)
        elif op.phase == "OPT":
            self._step(rank, op, s)
            return True
        else:
            raise RuntimeError(f"rank {rank}, {op.label}: unknown phase {op.phase!r}")
        if not self.in_pieces:  # `run` is the result
            self._keep(rank, op, run)
            return True
        if op.part is None:  # a whole op of a generator stage: no collective inside
            try:
                request = next(run)
            except StopIteration as finished:
                self._keep(rank, op, finished.value)
                return True
            raise RuntimeError(
                f"rank {rank}, {op.label}: asks for {request[0]}, but the program has no collective inside this op"
            )
        self.running[rank] = (op.label.rpartition(".")[0], run, None)
        return self._resume(rank, op, None)

    def _keep(self, rank: int, op, result) -> None:
        """Store a finished forward's output or backward's input gradient for the next stage."""
        stage = self.stages[op.stage]
        if op.phase == "F" and not stage.is_last:
            self._rank_store(rank)[("F", op.microbatch, op.stage)] = result
        elif op.phase == "B" and not stage.is_first:
            self._rank_store(rank)[("B", op.microbatch, op.stage)] = result

    def _resume(self, rank: int, op, answer) -> bool:
        """Run the rank's op in pieces up to its next collective (parked as its request)."""
        if rank not in self.running or self.running[rank][0] != op.label.rpartition(".")[0]:
            raise RuntimeError(
                f"rank {rank}, {op.label}: runs while {self.running.get(rank, ('nothing',))[0]} is the op in progress"
            )
        whole, run, _ = self.running[rank]
        if op.part and answer is None:
            raise RuntimeError(f"rank {rank}, {op.label}: runs before the collective that ends piece {op.part - 1}")
        try:
            request = run.send(answer) if op.part else next(run)
        except StopIteration as finished:
            del self.running[rank]
            self._keep(rank, op, finished.value)
            return True
        self.running[rank] = (whole, run, request)
        return False

    def work(self, rank: int, op) -> float:
        """The piece just run's work over the cost model's estimate: an MoE experts piece's rows
        over its even share (the exchange ending it says), else 1.0."""
        request = self.running[rank][2] if op.part is not None and rank in self.running else None
        return request[2] if request is not None and len(request) > 2 else 1.0

    def tensor_parallel_input(self, rank: int, op) -> np.ndarray:
        """This rank's input to the tensor-parallel collective `op`: what its op in progress asked
        for, or (tag ...grads@{stage}) the replicated parameters' gradients to sum before the step."""
        if _is_grad_sync(op):
            sync = self.stages[int(op.tag.rpartition("@")[2])].grad_sync()
            kind, flat = next(sync)
            self.syncs[(rank, op.tag)] = sync
            return flat
        whole, _, request = self.running.get(rank, ("nothing", None, None))
        if request is None or request[0] != op.kind:
            raise RuntimeError(
                f"rank {rank}, {op.label}: {whole} asks for "
                f"{'nothing' if request is None else request[0]} here, not {op.kind}"
            )
        return request[1]

    def tensor_parallel_output(self, rank: int, op, result: np.ndarray) -> None:
        """The collective's result: the answer the op's next piece resumes with; a gradient sum is
        written into the gradients at once."""
        if not _is_grad_sync(op):
            self.answers[rank] = result
            return
        try:
            self.syncs.pop((rank, op.tag)).send(result)
        except StopIteration:
            return
        raise RuntimeError(f"rank {rank}, {op.label}: the gradient sum asked for a second collective")

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
        ref = reference_step(
            self.cfg, init_params(self.cfg, self.seed), self.tokens, self.targets, self.optimizer, self.lr
        )
        params = {name: value for stage in self.stages for name, value in stage.params.items()}
        grads = {name: value for stage in self.stages for name, value in stage.grads.items()}
        if set(params) != set(ref.params):
            raise RuntimeError(
                f"stages hold parameters {sorted(set(params) ^ set(ref.params))} differently from the reference model"
            )
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
            **(routing_summary(ref.routings, self.cfg.moe.num_experts) if self.cfg.moe else {}),
        }
