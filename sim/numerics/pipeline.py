"""What the engine calls to really run a pipeline schedule's math on the shadow model.

Each rank has a store `tag -> array`, tag = MessageTag(phase F | B, microbatch, producer stage): forward
F{j}@{s} is stage s's output activation for microbatch j, B{j}@{s} the gradient w.r.t. stage s's
input. Compute ops read their input from the store (popping it, so it is used once) and write
their output to it; sends read the store, receives write it. A schedule that reads a tensor
before it was produced or delivered fails with the rank, the op and the missing tensor.
`finish` compares the updated weights with the single-device reference.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from clustersim.schedules.ir import Collective, Compute, MessageTag, Phase, Recv, Send
from clustersim.schedules.tags import ChunkTail, GradSync, StageInput
from clustersim.sim.numerics.optim import SGD, Adam, make_optimizer
from clustersim.sim.numerics.plan import UNSHARDED, Sharding, TrainingStep, make_batch
from clustersim.sim.numerics.reference import max_errors, reference_step
from clustersim.sim.numerics.routing import routing_summary
from clustersim.sim.numerics.stages import StageModel
from clustersim.sim.numerics.tensor_parallel import UNIT_BOUNDARY, TensorParallelStage
from clustersim.sim.numerics.transformer import ShadowConfig, init_params

Request = tuple  # what a stage generator yields: (kind, this rank's input[, work])
Running = tuple[str, Generator[Request, Any, Any], Request | None]  # (op label, generator, its request)


class PipelineNumerics:
    """Shadow-model numerics for one training step of a pipeline-parallel schedule."""

    def __init__(
        self,
        cfg: ShadowConfig,
        stage_to_rank: dict[int, int],
        step: TrainingStep,
        sharding: Sharding = UNSHARDED,
        data: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        """`stage_to_rank` places stages 0..S-1. `data`: (tokens, targets), each (step.rows,
        seq_len), when the batch is a slice of a larger one (a data-parallel replica's); default:
        drawn from the step's seed. With tp > 1 this pipeline is tensor-parallel rank
        `sharding.tp_rank` of its group: its stages hold that rank's shards, and each forward and
        backward runs piece by piece (ops with `part`), its tensor-parallel collectives (on the
        "tp" stream) carrying the pieces' partial results. With ep > 1 it is expert-parallel rank
        `sharding.ep_rank` of its MoE layers' groups: it holds that rank's experts, and its tokens
        travel to them by all_to_all (on the "ep" stream)."""
        num_stages = len(stage_to_rank)
        if set(stage_to_rank) != set(range(num_stages)):
            raise ValueError(f"stage_to_rank covers stages {sorted(stage_to_rank)}, expected 0..{num_stages - 1}")
        self.cfg = cfg
        self.step = step
        self.num_stages = num_stages
        self.num_microbatches = step.num_microbatches
        self.micro_batch_size = step.micro_batch_size
        self.stage_to_rank = dict(stage_to_rank)
        self.tokens, self.targets = data or make_batch(cfg, step.seed, step.rows)  # (m*b, s)
        params = init_params(cfg, step.seed)
        self.sharding = sharding
        self.in_pieces = sharding.in_pieces  # stages run as generators that yield their collectives
        self.stages: list[StageModel] | list[TensorParallelStage]
        if self.in_pieces:
            self.stages = [
                TensorParallelStage(cfg, s, num_stages, params, step.num_microbatches, sharding, step.recompute_full)
                for s in range(num_stages)
            ]
        else:
            self.stages = [
                StageModel(cfg, s, num_stages, params, step.num_microbatches, step.recompute_full)
                for s in range(num_stages)
            ]
        self.running: dict[int, Running] = {}  # rank -> the op in progress
        self.answers: dict[int, np.ndarray] = {}  # rank -> the collective result its next piece resumes with
        self.beside: set[int] = set()  # ranks whose piece ran beside the collective in flight (tp_comm_overlap)
        self.syncs: dict[
            tuple[int, GradSync], Generator[Request, np.ndarray, None]
        ] = {}  # (rank, tag) -> a gradient sum awaiting its result
        self.optimizers: list[Adam | SGD] = [make_optimizer(step.optimizer, step.lr) for _ in range(num_stages)]
        self.stepped: set[int] = set()
        self.store: dict[int, dict[MessageTag, np.ndarray]] = {rank: {} for rank in sorted(set(stage_to_rank.values()))}

    def _microbatch(self, data: np.ndarray, mb: int) -> np.ndarray:
        b = self.micro_batch_size
        return data[mb * b : (mb + 1) * b]  # (b, s)

    def _rank_store(self, rank: int) -> dict[MessageTag, np.ndarray]:
        if rank not in self.store:
            raise RuntimeError(f"rank {rank} holds no pipeline stage (stage_to_rank: {self.stage_to_rank})")
        return self.store[rank]

    def _take(self, rank: int, op: Compute | Collective, tag: MessageTag, what: str) -> np.ndarray:
        store = self._rank_store(rank)
        if tag not in store:
            raise RuntimeError(f"rank {rank}, {op.label}: {what} {tag} used before it arrived")
        return store.pop(tag)

    def run_compute(self, rank: int, op: Compute) -> None:
        """Run F, B or OPT of `op.stage` (for `op.microbatch`) on `rank`'s store; for a piece of a
        tensor-parallel op, run the op up to its next collective (`advance`)."""
        self.advance(rank, op)

    def advance(self, rank: int, op: Compute) -> bool:
        """`run_compute`, saying whether the whole op is done (its last piece has run)."""
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
        run: Any
        if op.phase == Phase.OPT:
            self._step(rank, op, s)
            return True
        assert mb is not None  # a forward or backward names its microbatch (schedules.validate)
        if op.phase == Phase.F:
            if stage.is_first:
                inp = self._microbatch(self.tokens, mb)  # (b, s)
            else:
                inp = self._take(rank, op, MessageTag(Phase.F, mb, s - 1), "activation")  # (b, s, h) or its chunk
            run = stage.forward(mb, inp, self._microbatch(self.targets, mb) if stage.is_last else None)
        elif op.phase == Phase.B:
            dout = None if stage.is_last else self._take(rank, op, MessageTag(Phase.B, mb, s + 1), "gradient")
            run = stage.backward(mb, dout, (mb, s) in self.step.split_backward)
        elif op.phase == Phase.W:  # whole, and no collective: the gradients its B computed
            stage.weight_gradient(mb)
            return True
        else:
            raise RuntimeError(f"rank {rank}, {op.label}: the shadow model has no numerics for phase {op.phase}")
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

    def _keep(self, rank: int, op: Compute, result: np.ndarray) -> None:
        """Store a finished forward's output or backward's input gradient for the next stage."""
        stage = self.stages[op.stage]
        assert op.microbatch is not None
        if (op.phase == Phase.F and not stage.is_last) or (op.phase == Phase.B and not stage.is_first):
            self._rank_store(rank)[MessageTag(op.phase, op.microbatch, op.stage)] = result

    def _resume(self, rank: int, op: Compute, answer: np.ndarray | None) -> bool:
        """Run the rank's op in pieces up to its next collective (parked as its request)."""
        if rank not in self.running or self.running[rank][0] != op.label.rpartition(".")[0]:
            raise RuntimeError(
                f"rank {rank}, {op.label}: runs while {self.running.get(rank, ('nothing',))[0]} is the op in progress"
            )
        whole, run, parked = self.running[rank]
        if op.part and answer is None and (parked is None or parked[0] != UNIT_BOUNDARY):
            if self.sharding.tp_comm_overlap and parked is not None and rank not in self.beside:
                # the GEMM beside the collective (schedules.tp_overlap): its math is the piece's that waits for it
                self.beside.add(rank)
                return False
            raise RuntimeError(f"rank {rank}, {op.label}: runs before the collective that ends piece {op.part - 1}")
        self.beside.discard(rank)
        try:
            request = run.send(answer) if op.part else next(run)
        except StopIteration as finished:
            del self.running[rank]
            self._keep(rank, op, finished.value)
            return True
        self.running[rank] = (whole, run, request)
        return False

    def work(self, rank: int, op: Compute) -> float:
        """The piece just run's work over the cost model's estimate: an MoE experts piece's rows
        over its even share (the exchange ending it says), else 1.0."""
        request = self.running[rank][2] if op.part is not None and rank in self.running else None
        return request[2] if request is not None and len(request) > 2 else 1.0

    def collective_input(self, rank: int, op: Collective) -> np.ndarray:
        """This rank's input to the tensor- or expert-parallel collective `op` (a pipeline's own):
        what its op in progress asked for, or (a GradSync) the replicated parameters' gradients to
        sum before the step."""
        if isinstance(op.tag, StageInput):  # the chunk of a pipeline message this rank received
            return self._take(rank, op, _message(op.tag), "chunk of")
        if isinstance(op.tag, ChunkTail):  # time only: the collective before it carried the data
            return np.zeros(self.sharding.tp)
        if isinstance(op.tag, GradSync):
            stage = self.stages[op.tag.stage]
            assert isinstance(stage, TensorParallelStage)  # a gradient sum needs a tensor-parallel group
            sync = stage.grad_sync()
            _, flat = next(sync)
            self.syncs[(rank, op.tag)] = sync
            return flat
        whole, _, request = self.running.get(rank, ("nothing", None, None))
        if request is None or request[0] != op.kind:
            raise RuntimeError(
                f"rank {rank}, {op.label}: {whole} asks for "
                f"{'nothing' if request is None else request[0]} here, not {op.kind}"
            )
        return request[1]

    def collective_output(self, rank: int, op: Collective, result: object) -> None:
        """The collective's result: the answer the op's next piece resumes with; a gradient sum is
        written into the gradients at once."""
        if not isinstance(result, np.ndarray):
            raise TypeError(f"rank {rank}, {op.label}: the collective's result is not an array")
        if isinstance(op.tag, StageInput):  # the t chunks, in rank order: the whole message
            b, s, h = self.micro_batch_size, self.cfg.seq_len, self.cfg.hidden
            self._rank_store(rank)[_message(op.tag)] = result.reshape(b, s, h)
            return
        if isinstance(op.tag, ChunkTail):
            return
        if not isinstance(op.tag, GradSync):
            self.answers[rank] = result
            return
        try:
            self.syncs.pop((rank, op.tag)).send(result)
        except StopIteration:
            return
        raise RuntimeError(f"rank {rank}, {op.label}: the gradient sum asked for a second collective")

    def _step(self, rank: int, op: Compute, s: int) -> None:
        stage = self.stages[s]
        if s in self.stepped:
            raise RuntimeError(f"rank {rank}, {op.label}: stage {s} took its optimizer step twice")
        if missing := stage.missing_backward():
            raise RuntimeError(f"rank {rank}, {op.label}: optimizer step before the backward of microbatches {missing}")
        if missing := stage.missing_weight_gradients():
            raise RuntimeError(f"rank {rank}, {op.label}: optimizer step before the W of microbatches {missing}")
        self.optimizers[s].step(stage.params, stage.grads)
        self.stepped.add(s)

    def send_payload(self, rank: int, op: Send) -> np.ndarray:
        """The array `op` carries, or under scatter/gather this rank's 1/t chunk of it (flat); it
        stays in the sender's store."""
        store = self._rank_store(rank)
        if op.tag not in store:
            raise RuntimeError(f"rank {rank}, {op.label}: {MessageTag(*op.tag)} sent before it was computed")
        if self.sharding.scatter_gather:
            return np.array_split(store[op.tag].ravel(), self.sharding.tp)[self.sharding.tp_rank].copy()
        return store[op.tag]

    def receive(self, rank: int, op: Recv, payload: object) -> None:
        """Deliver `payload` (the array the matching Send carried) for `op` into `rank`'s store."""
        if not isinstance(payload, np.ndarray):
            raise TypeError(f"rank {rank}, {op.label}: the payload is not an array")
        store = self._rank_store(rank)
        if op.tag in store:
            raise RuntimeError(f"rank {rank}, {op.label}: {MessageTag(*op.tag)} received while an unused copy is held")
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
        step = self.step
        ref = reference_step(
            self.cfg, init_params(self.cfg, step.seed), self.tokens, self.targets, step.optimizer, step.lr
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


def _message(tag: StageInput) -> MessageTag:
    """The pipeline message a StageInput gather puts together."""
    return MessageTag(Phase(tag.phase), tag.microbatch, tag.stage)
