"""Shadow-model numerics of data parallelism and ZeRO (and of tensor parallelism's several
pipelines per replica): replicas of a pipeline on slices of the global batch whose gradients and
weights really travel through the collectives.

Each replica d (a PipelineNumerics) trains on rows [d m b, (d+1) m b) of the global batch, its
loss scaled by 1/m; the gradient collectives sum the replicas' gradients, and the sum is divided
by dp (as DDP averages), which gives the gradient of the mean loss over the global batch.

A stage's gradients (and weights) are flattened in parameter-name order and cut into the
program's buckets (numpy.array_split); a reduce-scatter leaves data-parallel rank i with chunk
i of each bucket (array_split again), which is the only part its optimizer steps (ZeRO 1, 2, 3)
and which the weight all-gather then spreads. Under ZeRO 3 a rank keeps only its chunks of the
weights between ops: the rest is NaN, so a forward or backward that runs without its gather
poisons the result instead of passing by accident.

With tensor parallelism t, replica d is t pipelines, one per tensor-parallel rank, each holding
its shards (a PipelineNumerics with tp = t); the data-parallel groups join the pipelines of equal
tensor-parallel rank, and tensor-parallel collectives go to the pipeline they belong to.

With expert parallelism (ep > 1) replica d is expert-parallel rank d mod ep of its MoE layers and
uses only that rank's experts; their gradients (tags egrads@..., eparams@...) are reduced among the
replicas holding the same experts, the other gradients over all replicas as before. Each set is
flattened and bucketed on its own, as the program's collectives are.
"""

from __future__ import annotations

import re

import numpy as np

from clustersim.schedules.tensor_parallel import EP_STREAM, TP_STREAM
from clustersim.sim.collectives.steps import split_bounds
from clustersim.sim.numerics.moe import experts_of_rank, routing_summary
from clustersim.sim.numerics.optim import make_optimizer
from clustersim.sim.numerics.pipeline import PipelineNumerics, make_batch, max_errors
from clustersim.sim.numerics.reference import reference_step
from clustersim.sim.numerics.sharding import is_sharded, unshard_params
from clustersim.sim.numerics.transformer import ShadowConfig, init_params

_TAG = re.compile(r"(?P<what>e?grads|e?params)@(?P<stage>\d+)\.t\d+(?:\.r\d+)?\.(?:b(?P<bucket>\d+)|(?P<op>.+))$")


def _grad_set(what: str) -> str:
    """The gradient set a tag's kind belongs to: params -> grads, eparams -> egrads."""
    return what.replace("params", "grads")


class DataParallelNumerics:
    """What the engine calls (the Numerics protocol) for dp pipeline replicas and ZeRO stage `zero`."""

    def __init__(
        self,
        cfg: ShadowConfig,
        replicas: list[dict[int, int]],
        num_microbatches: int,
        micro_batch_size: int,
        seed: int,
        optimizer: str,
        lr: float,
        zero: int,
        buckets: dict[tuple[str, int], int],
        recompute_full: bool = False,
        tp: int = 1,
        sequence_parallel: bool = False,
        ep: int = 1,
    ):
        """`replicas`: every pipeline's placement, replica-major: pipeline i is tensor-parallel rank
        i % tp of data-parallel replica i // tp. `buckets[(set, stage)]`: how many buckets the
        program cuts a stage's gradient set into, set "grads" (all but the expert-parallel
        experts) or "egrads" (those experts, ep > 1)."""
        self.cfg, self.seed, self.optimizer, self.lr, self.zero, self.tp = cfg, seed, optimizer, lr, zero, tp
        self.dp, self.ep = len(replicas) // tp, ep
        rows = num_microbatches * micro_batch_size
        self.tokens, self.targets = make_batch(cfg, seed, self.dp * rows)  # (dp*m*b, s)
        self.replicas = [
            PipelineNumerics(
                cfg,
                len(placement),
                num_microbatches,
                micro_batch_size,
                placement,
                seed,
                optimizer,
                lr,
                data=(
                    self.tokens[i // tp * rows : (i // tp + 1) * rows],
                    self.targets[i // tp * rows : (i // tp + 1) * rows],
                ),
                recompute_full=recompute_full,
                tp=tp,
                tp_rank=i % tp,
                sequence_parallel=sequence_parallel,
                ep=ep,
                ep_rank=i // tp % ep,
            )
            for i, placement in enumerate(replicas)
        ]
        self.replica_of = {rank: d for d, placement in enumerate(replicas) for rank in placement.values()}
        self.buckets = buckets
        self._bounds: dict[tuple, list[tuple[int, int]]] = {}  # (set, stage, size) -> its buckets
        self.shard_optimizers: dict[tuple[int, int], object] = {}  # (rank, stage) -> optimizer of its chunks
        self.gathered: dict[tuple[int, str], np.ndarray] = {}  # ZeRO 3: (rank, consumer op) -> full weights
        if zero == 3:
            for rank in self.replica_of:
                for stage in self._stages_of(rank):
                    self._keep_only_own_chunks(rank, stage)

    # -- flat views of a stage ---------------------------------------------------------------

    def _stage(self, rank: int, stage: int):
        return self.replicas[self.replica_of[rank]].stages[stage]

    def _stages_of(self, rank: int) -> list[int]:
        placement = self.replicas[self.replica_of[rank]].stage_to_rank
        return [s for s, r in placement.items() if r == rank]

    def _names(self, rank: int, stage: int, what: str) -> list[str]:
        """The stage's parameter names in gradient set `what` ("grads" or "egrads"), sorted:
        with ep > 1 "egrads" is this rank's experts, "grads" the rest but the other ranks' experts."""
        names = sorted(self._stage(rank, stage).params)
        if self.ep == 1:
            return names if what == "grads" else []
        own = {
            f"expert{e}"
            for e in experts_of_rank(self.replica_of[rank] // self.tp % self.ep, self.cfg.moe.num_experts, self.ep)
        }
        routed = {n: n.split(".")[2] for n in names if ".moe.expert" in n}  # name -> "expert{e}"
        return [n for n in names if (n in routed) == (what == "egrads") and routed.get(n, "") in own | {""}]

    def _flat(self, tensors: dict[str, np.ndarray], names: list[str]) -> np.ndarray:
        return np.concatenate([tensors[name].ravel() for name in names]) if names else np.zeros(0)

    def _unflat(self, flat: np.ndarray, into: dict[str, np.ndarray], names: list[str]) -> None:
        offset = 0
        for name in names:
            size = into[name].size
            into[name][...] = flat[offset : offset + size].reshape(into[name].shape)
            offset += size

    def _bucket_bounds(self, what: str, stage: int, size: int) -> list[tuple[int, int]]:
        key = (what, stage, size)
        if key not in self._bounds:
            edges = split_bounds(size, self.buckets[(what, stage)]).tolist()
            self._bounds[key] = list(zip(edges[:-1], edges[1:]))
        return self._bounds[key]

    def _chunk(self, rank: int, what: str, lo: int, hi: int) -> tuple[int, int]:
        """This rank's chunk [lo', hi') of the bucket [lo, hi): its index's piece among the ranks
        reducing set `what` (all dp replicas; for "egrads" the dp / ep holding the same experts)."""
        d = self.replica_of[rank] // self.tp
        index, members = (d // self.ep, self.dp // self.ep) if what == "egrads" else (d, self.dp)
        edges = split_bounds(hi - lo, members)
        return lo + int(edges[index]), lo + int(edges[index + 1])

    def _keep_only_own_chunks(self, rank: int, stage: int) -> None:
        params = self._stage(rank, stage).params
        names = self._names(rank, stage, "grads")
        flat = self._flat(params, names)
        kept = np.full_like(flat, np.nan)
        for lo, hi in self._bucket_bounds("grads", stage, flat.size):
            a, b = self._chunk(rank, "grads", lo, hi)
            kept[a:b] = flat[a:b]
        self._unflat(kept, params, names)

    # -- the Numerics protocol -----------------------------------------------------------------

    def run_compute(self, rank: int, op) -> None:
        replica = self.replicas[self.replica_of[rank]]
        if op.phase == "OPT" and self.ep == self.dp > 1:  # each expert's only holder: no collective averages it
            grads = self._stage(rank, op.stage).grads
            for name in self._names(rank, op.stage, "egrads"):
                grads[name] /= self.dp
        if op.phase == "OPT" and self.zero >= 1:
            self._step_chunks(rank, op)
            return
        if self.zero == 3 and op.phase in ("F", "B") and not op.part:  # an op's first piece brings the weights
            if (rank, op.label) not in self.gathered:
                raise RuntimeError(f"rank {rank}, {op.label}: runs before its weights were gathered")
            self._unflat(
                self.gathered.pop((rank, op.label)),
                self._stage(rank, op.stage).params,
                self._names(rank, op.stage, "grads"),
            )
        finished = replica.run_compute(rank, op)
        if self.zero == 3 and op.phase in ("F", "B") and finished:
            self._keep_only_own_chunks(rank, op.stage)  # free the gathered weights

    def work(self, rank: int, op) -> float:
        return self.replicas[self.replica_of[rank]].work(rank, op)

    def send_payload(self, rank: int, op) -> np.ndarray:
        return self.replicas[self.replica_of[rank]].send_payload(rank, op)

    def receive(self, rank: int, op, payload) -> None:
        self.replicas[self.replica_of[rank]].receive(rank, op, payload)

    def collective_input(self, rank: int, op) -> np.ndarray:
        if op.stream in (TP_STREAM, EP_STREAM):
            return self.replicas[self.replica_of[rank]].tensor_parallel_input(rank, op)
        what, stage, bucket = self._parse(op)
        stage_model = self._stage(rank, stage)
        names = self._names(rank, stage, _grad_set(what))
        if what.endswith("grads"):
            flat = self._flat(stage_model.grads, names)
            lo, hi = self._bucket_bounds(what, stage, flat.size)[bucket]
            return flat[lo:hi].copy()
        flat = self._flat(stage_model.params, names)
        bounds = self._bucket_bounds(_grad_set(what), stage, flat.size)
        chosen = bounds if bucket is None else [bounds[bucket]]  # zero 3 gathers the whole stage
        return np.concatenate([flat[slice(*self._chunk(rank, _grad_set(what), lo, hi))] for lo, hi in chosen])

    def collective_output(self, rank: int, op, result: np.ndarray) -> None:
        if op.stream in (TP_STREAM, EP_STREAM):
            self.replicas[self.replica_of[rank]].tensor_parallel_output(rank, op, result)
            return
        what, stage, bucket = self._parse(op)
        grad_set = _grad_set(what)
        stage_model = self._stage(rank, stage)
        target = stage_model.grads if what.endswith("grads") else stage_model.params
        names = self._names(rank, stage, grad_set)
        flat = self._flat(target, names)
        bounds = self._bucket_bounds(grad_set, stage, flat.size)
        if what.endswith("grads"):
            lo, hi = bounds[bucket]
            if op.kind == "all_reduce":
                flat[lo:hi] = result / self.dp
            else:  # reduce_scatter: only this rank's chunk of the sum is valid now
                a, b = self._chunk(rank, grad_set, lo, hi)
                flat[lo:hi] = np.nan
                flat[a:b] = result / self.dp
        else:  # all_gather: member after member (group order), each one's chunks bucket by bucket
            chosen = bounds if bucket is None else [bounds[bucket]]
            offset = 0
            for member in op.group:
                for lo, hi in chosen:
                    a, b = self._chunk(member, grad_set, lo, hi)
                    flat[a:b] = result[offset : offset + b - a]
                    offset += b - a
            if bucket is None:  # ZeRO 3: a copy for the one op that asked for it (prefetch)
                self.gathered[(rank, _TAG.match(op.tag)["op"])] = flat
                return
        self._unflat(flat, target, names)

    def _parse(self, op) -> tuple[str, int, int | None]:
        m = _TAG.match(op.tag)
        if m is None:
            raise RuntimeError(f"{op.label}: not a data-parallel collective this numerics knows")
        return m["what"], int(m["stage"]), int(m["bucket"]) if m["bucket"] is not None else None

    def _step_chunks(self, rank: int, op) -> None:
        """ZeRO: the optimizer steps only this rank's chunk of every bucket of each gradient set."""
        stage_model = self._stage(rank, op.stage)
        if missing := stage_model.missing_backward():
            raise RuntimeError(f"rank {rank}, {op.label}: optimizer step before the backward of microbatches {missing}")
        optimizer = self.shard_optimizers.setdefault((rank, op.stage), make_optimizer(self.optimizer, self.lr))
        for what in ("grads", "egrads"):
            names = self._names(rank, op.stage, what)
            params, grads = self._flat(stage_model.params, names), self._flat(stage_model.grads, names)
            for b, (lo, hi) in enumerate(self._bucket_bounds(what, op.stage, params.size) if names else []):
                a, z = self._chunk(rank, what, lo, hi)
                chunk = {f"{what}{b}": params[a:z].copy()}
                optimizer.step(chunk, {f"{what}{b}": grads[a:z]})
                params[a:z] = chunk[f"{what}{b}"]
            self._unflat(params, stage_model.params, names)

    def finish(self) -> dict:
        """Every replica's weights (ZeRO 3: put together from every rank's chunks; tensor
        parallelism: from every rank's shards, and each rank's whole copies) against one device on
        the global batch."""
        ref = reference_step(
            self.cfg, init_params(self.cfg, self.seed), self.tokens, self.targets, self.optimizer, self.lr
        )
        worst_abs = worst_rel = 0.0
        for d in range(self.dp):
            shards = [self._pipeline_params(d * self.tp + k) for k in range(self.tp)]
            params = unshard_params(shards, self.cfg, self.tp) if self.tp > 1 else shards[0]
            # unshard_params takes the whole parameters from tensor-parallel rank 0: the other
            # ranks' copies must have come out equal too (their partial gradients were summed)
            copies = [{name: value for name, value in shard.items() if not is_sharded(name)} for shard in shards[1:]]
            for got in [params, *copies]:
                abs_err, rel_err = max_errors(got, ref.params)
                worst_abs, worst_rel = max(worst_abs, abs_err), max(worst_rel, rel_err)
        losses = [np.mean(list(r.stages[-1].losses.values())) for r in self.replicas]
        return {
            "max_abs_err": worst_abs,
            "max_rel_err": worst_rel,
            "loss": float(np.mean(losses)),
            "reference_loss": ref.loss,
            "params_compared": len(ref.params),
            "replicas": self.dp,
            **(routing_summary(ref.routings, self.cfg.moe.num_experts) if self.cfg.moe else {}),
        }

    def _pipeline_params(self, i: int) -> dict[str, np.ndarray]:
        """Pipeline i's parameters; each expert of an expert-parallel layer from the replica in
        i's expert-parallel group that holds it; under ZeRO 3 each chunk from the data-parallel
        rank that kept it."""
        params = {}
        replica = self.replicas[i]
        for stage in replica.stages:
            params.update(stage.params if self.zero != 3 else self._gathered_stage(i, stage))
            for name in [n for n in stage.params if ".moe.expert" in n] if self.ep > 1 else []:
                params[name] = self._expert_holder(i, name).stages[stage.stage].params[name]
        return params

    def _expert_holder(self, i: int, name: str):
        """The pipeline of i's expert-parallel group (and tensor-parallel rank) holding expert `name`."""
        e = int(name.split(".")[2][len("expert") :])  # layer{L}.moe.expert{e}.fc.w
        first = i // self.tp // self.ep * self.ep
        return self.replicas[(first + e // (self.cfg.moe.num_experts // self.ep)) * self.tp + i % self.tp]

    def _gathered_stage(self, i: int, stage) -> dict[str, np.ndarray]:
        """ZeRO 3: a stage's parameters put together from every data-parallel rank's chunks."""
        rank = self.replicas[i].stage_to_rank[stage.stage]
        names = self._names(rank, stage.stage, "grads")
        flat = np.full_like(self._flat(stage.params, names), np.nan)
        for d in range(self.dp):
            other = self.replicas[d * self.tp + i % self.tp]
            holder = other.stage_to_rank[stage.stage]
            own = self._flat(other.stages[stage.stage].params, names)
            for lo, hi in self._bucket_bounds("grads", stage.stage, flat.size):
                a, b = self._chunk(holder, "grads", lo, hi)
                flat[a:b] = own[a:b]
        view = {name: np.empty_like(value) for name, value in stage.params.items()}
        self._unflat(flat, view, names)
        return view
