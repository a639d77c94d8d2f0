"""Shadow-model numerics of data parallelism and ZeRO (and of tensor parallelism's several
pipelines per replica): replicas of a pipeline on slices of the global batch whose gradients and
weights really travel through the collectives.

Each replica d (a PipelineNumerics) trains on rows [d m b, (d+1) m b) of the global batch, its
loss scaled by 1/m; the gradient collectives sum the replicas' gradients, and the sum is divided
by dp (as DDP averages), which gives the gradient of the mean loss over the global batch.

A stage's gradients (and weights) are flattened and cut into buckets and chunks as
sim/numerics/buckets.py says (ZeRO 3: a bucket per unit); the collectives' tags (schedules.tags)
name the stage, the set and the bucket (or unit) they carry. Under ZeRO 3 a rank keeps only its
chunks of the weights between ops: the rest is NaN, so a piece that runs without its unit's
gather poisons the result instead of passing by accident. So under ZeRO 1-2 with the gathers
overlapping the next forward (schedules.param_gather): a rank starts with its chunks and its first
forward's first bucket (gathered after the last update), the check takes every rank's chunks.

With tensor parallelism t, replica d is t pipelines, one per tensor-parallel rank, each holding
its shards (a PipelineNumerics with tp = t); the data-parallel groups join the pipelines of equal
tensor-parallel rank, and tensor-parallel collectives go to the pipeline they belong to. With
expert parallelism (ep > 1) replica d is expert-parallel rank d mod ep of its MoE layers and uses
only that rank's experts, whose gradients (set "egrads", flattened and bucketed on its own) are
reduced among the replicas holding the same experts, the rest over all replicas.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from clustersim.schedules.ir import PIPELINE_PHASES, Collective, Compute, Phase, Recv, Send
from clustersim.schedules.tags import GradBucket, ParamBucket, ParamGather
from clustersim.schedules.tensor_parallel import EP_STREAM, TP_STREAM
from clustersim.schedules.zero3 import unit_ranges
from clustersim.sim.numerics.buckets import GRADIENT_SETS, Buckets, flat, set_names, unflat, unit_of_name, unit_sizes
from clustersim.sim.numerics.moe import experts_of_rank
from clustersim.sim.numerics.optim import SGD, Adam, make_optimizer
from clustersim.sim.numerics.pipeline import PipelineNumerics
from clustersim.sim.numerics.plan import UNSHARDED, Sharding, TrainingStep, make_batch
from clustersim.sim.numerics.reference import max_errors, reference_step
from clustersim.sim.numerics.routing import routing_summary
from clustersim.sim.numerics.sharding import is_sharded, unshard_params
from clustersim.sim.numerics.stages import StageModel, stage_layers
from clustersim.sim.numerics.tensor_parallel import TensorParallelStage
from clustersim.sim.numerics.transformer import ShadowConfig, init_params

Stage = StageModel | TensorParallelStage


class DataParallelNumerics:
    """What the engine calls (the Numerics protocol) for dp pipeline replicas and ZeRO stage `zero`."""

    def __init__(
        self,
        cfg: ShadowConfig,
        replicas: list[dict[int, int]],
        step: TrainingStep,
        zero: int,
        buckets: dict[tuple[str, int], int],
        sharding: Sharding = UNSHARDED,
        unit_buckets: Callable[[int], list[range]] | None = None,
        next_step_gathers: frozenset[int] | None = None,
    ):
        """`replicas`: every pipeline's placement, replica-major: pipeline i is tensor-parallel rank
        i % tp of data-parallel replica i // tp. `buckets[(set, stage)]`: how many buckets the
        program cuts a stage's gradient set into, set "grads" (all but the expert-parallel
        experts) or "egrads" (those experts, ep > 1). `sharding`: the split of every pipeline
        (its ranks are each pipeline's own). `unit_buckets(stage)`: the units in each "grads"
        bucket of whole units (overlapped; ZeRO 3 default: one each), flattened unit by unit.
        `next_step_gathers`: gathers overlapped, these stages' first bucket whole (module docstring)."""
        tp, ep = sharding.tp, sharding.ep
        self.cfg, self.step, self.zero, self.tp = cfg, step, zero, tp
        self.sharded_between_steps = zero == 3 or next_step_gathers is not None
        self.dp, self.ep = len(replicas) // tp, ep
        self.tokens, self.targets = make_batch(cfg, step.seed, self.dp * step.rows)  # (dp*m*b, s)
        rows_of = [slice(d * step.rows, (d + 1) * step.rows) for d in range(self.dp)]  # replica d's rows of the batch
        data = [(self.tokens[r], self.targets[r]) for r in rows_of]
        self.replicas = [
            PipelineNumerics(cfg, where, step, sharding.at(tp_rank=i % tp, ep_rank=i // tp % ep), data=data[i // tp])
            for i, where in enumerate(replicas)
        ]
        self.replica_of = {rank: d for d, placement in enumerate(replicas) for rank in placement.values()}
        self.buckets = Buckets(buckets, self.dp, ep)
        self.shard_optimizers: dict[tuple[int, int], Adam | SGD] = {}  # (rank, stage) -> optimizer of its chunks
        # ZeRO 3: (rank, piece a unit starts in) -> (unit, the stage's weights with that unit's filled in)
        self.gathered: dict[tuple[int, str], tuple[int, np.ndarray]] = {}
        num_stages = len(replicas[0])
        units = [unit_ranges(stage_layers(cfg, s, num_stages), sharding.unit_layers) for s in range(num_stages)]
        self.unit_of = [unit_of_name(stage_units) for stage_units in units]  # stage -> (name -> its unit)
        groups = unit_buckets or (lambda s: [range(k, k + 1) for k in range(len(units[s]))])  # ZeRO 3: one each
        self.by_unit = unit_buckets is not None or zero == 3
        for rank in self.replica_of if self.by_unit else ():
            for stage in self._stages_of(rank):
                params, names = self._stage(rank, stage).params, self._names(rank, stage, "grads")
                self.buckets.fix("grads", stage, unit_sizes(params, names, self.unit_of[stage], groups(stage)))
                if self.sharded_between_steps:
                    self._keep_only_own_chunks(rank, stage, 0 if stage in (next_step_gathers or ()) else None)

    # -- a rank's stages, sets and chunks --------------------------------------------------------

    def _stage(self, rank: int, stage: int) -> Stage:
        return self.replicas[self.replica_of[rank]].stages[stage]

    def _stages_of(self, rank: int) -> list[int]:
        placement = self.replicas[self.replica_of[rank]].stage_to_rank
        return [s for s, r in placement.items() if r == rank]

    def _names(self, rank: int, stage: int, what: str) -> list[str]:
        """The stage's parameter names in gradient set `what` on `rank` (buckets.set_names)."""
        own = None
        if self.ep > 1:
            assert self.cfg.moe is not None  # ep > 1 needs MoE layers (sim.scenario)
            ep_rank = self.replica_of[rank] // self.tp % self.ep
            own = {f"expert{e}" for e in experts_of_rank(ep_rank, self.cfg.moe.num_experts, self.ep)}
        names = set_names(list(self._stage(rank, stage).params), what, own)
        return sorted(names, key=self.unit_of[stage]) if self.by_unit else names  # unit by unit

    def _chunk(self, rank: int, what: str, lo: int, hi: int) -> tuple[int, int]:
        """This rank's chunk of the bucket [lo, hi) of set `what` (Buckets.chunk)."""
        return self.buckets.chunk(self.replica_of[rank] // self.tp, what, lo, hi)

    def _keep_only_own_chunks(self, rank: int, stage: int, whole: int | None = None) -> None:
        params = self._stage(rank, stage).params
        names = self._names(rank, stage, "grads")
        weights = flat(params, names)
        kept = np.full_like(weights, np.nan)
        for bucket, (lo, hi) in enumerate(self.buckets.bounds("grads", stage, weights.size)):
            a, b = (lo, hi) if bucket == whole else self._chunk(rank, "grads", lo, hi)
            kept[a:b] = weights[a:b]
        unflat(kept, params, names)

    # -- the Numerics protocol -----------------------------------------------------------------

    def run_compute(self, rank: int, op: Compute) -> None:
        replica = self.replicas[self.replica_of[rank]]
        if op.phase == Phase.OPT and self.ep == self.dp > 1:  # each expert's only holder: no collective averages it
            grads = self._stage(rank, op.stage).grads
            for name in self._names(rank, op.stage, "egrads"):
                grads[name] /= self.dp
        if op.phase == Phase.OPT and self.zero >= 1:
            self._step_chunks(rank, op)
            return
        if self.zero == 3 and op.phase in PIPELINE_PHASES:  # a unit's first piece brings its weights
            if (rank, op.label) in self.gathered:  # freed when the op ends: a piece after a unit's
                unit, gathered = self.gathered.pop((rank, op.label))  # last collective adds its bias
                params, names = self._stage(rank, op.stage).params, self._names(rank, op.stage, "grads")
                weights = flat(params, names)
                lo, hi = self.buckets.bounds("grads", op.stage, weights.size)[unit]
                weights[lo:hi] = gathered[lo:hi]
                unflat(weights, params, names)
            elif not op.part:
                raise RuntimeError(f"rank {rank}, {op.label}: runs before its weights were gathered")
        finished = replica.advance(rank, op)
        if self.zero == 3 and op.phase in PIPELINE_PHASES and finished:
            self._keep_only_own_chunks(rank, op.stage)  # free the gathered weights

    def work(self, rank: int, op: Compute) -> float:
        return self.replicas[self.replica_of[rank]].work(rank, op)

    def send_payload(self, rank: int, op: Send) -> np.ndarray:
        return self.replicas[self.replica_of[rank]].send_payload(rank, op)

    def receive(self, rank: int, op: Recv, payload: object) -> None:
        self.replicas[self.replica_of[rank]].receive(rank, op, payload)

    def collective_input(self, rank: int, op: Collective) -> np.ndarray:
        if op.stream in (TP_STREAM, EP_STREAM):
            return self.replicas[self.replica_of[rank]].collective_input(rank, op)
        tag = _data_parallel_tag(op)
        what = tag.gradient_set
        stage_model = self._stage(rank, tag.stage)
        names = self._names(rank, tag.stage, what)
        if isinstance(tag, GradBucket):
            grads = flat(stage_model.grads, names)
            lo, hi = self.buckets.bounds(what, tag.stage, grads.size)[tag.bucket]
            return grads[lo:hi].copy()
        weights = flat(stage_model.params, names)
        bounds = self.buckets.bounds(what, tag.stage, weights.size)
        chosen = [bounds[tag.bucket if isinstance(tag, ParamBucket) else tag.unit]]  # zero 3: a unit's
        return np.concatenate([weights[slice(*self._chunk(rank, what, lo, hi))] for lo, hi in chosen])

    def collective_output(self, rank: int, op: Collective, result: object) -> None:
        if op.stream in (TP_STREAM, EP_STREAM):  # the pipeline's own
            self.replicas[self.replica_of[rank]].collective_output(rank, op, result)
            return
        if not isinstance(result, np.ndarray):
            raise TypeError(f"rank {rank}, {op.label}: the collective's result is not an array")
        tag = _data_parallel_tag(op)
        what = tag.gradient_set
        stage_model = self._stage(rank, tag.stage)
        target = stage_model.grads if isinstance(tag, GradBucket) else stage_model.params
        names = self._names(rank, tag.stage, what)
        values = flat(target, names)
        bounds = self.buckets.bounds(what, tag.stage, values.size)
        if isinstance(tag, GradBucket):
            lo, hi = bounds[tag.bucket]
            if op.kind == "all_reduce":
                values[lo:hi] = result / self.dp
            else:  # reduce_scatter: only this rank's chunk of the sum is valid now
                a, b = self._chunk(rank, what, lo, hi)
                values[lo:hi] = np.nan
                values[a:b] = result / self.dp
        else:  # all_gather of a bucket (zero 3: a unit): member after member (group order), each one's chunk
            lo, hi = bounds[tag.bucket if isinstance(tag, ParamBucket) else tag.unit]
            offset = 0
            for member in op.group:
                a, b = self._chunk(member, what, lo, hi)
                values[a:b] = result[offset : offset + b - a]
                offset += b - a
            if isinstance(tag, ParamGather):  # ZeRO 3: a copy for the one piece that asked for it (prefetch)
                self.gathered[(rank, tag.consumer)] = (tag.unit, values)
                return
        unflat(values, target, names)

    def _step_chunks(self, rank: int, op: Compute) -> None:
        """ZeRO: the optimizer steps only this rank's chunk of every bucket of each gradient set."""
        stage_model = self._stage(rank, op.stage)
        if missing := stage_model.missing_backward():
            raise RuntimeError(f"rank {rank}, {op.label}: optimizer step before the backward of microbatches {missing}")
        optimizer = self.shard_optimizers.setdefault(
            (rank, op.stage), make_optimizer(self.step.optimizer, self.step.lr)
        )
        for what in GRADIENT_SETS:
            names = self._names(rank, op.stage, what)
            params, grads = flat(stage_model.params, names), flat(stage_model.grads, names)
            for b, (lo, hi) in enumerate(self.buckets.bounds(what, op.stage, params.size) if names else []):
                a, z = self._chunk(rank, what, lo, hi)
                chunk = {f"{what}{b}": params[a:z].copy()}
                optimizer.step(chunk, {f"{what}{b}": grads[a:z]})
                params[a:z] = chunk[f"{what}{b}"]
            unflat(params, stage_model.params, names)

    def finish(self) -> dict:
        """Every replica's weights (from every rank's chunks when sharded between steps, every tp
        rank's shards, and each rank's whole copies) against one device on the global batch."""
        step = self.step
        ref = reference_step(
            self.cfg, init_params(self.cfg, step.seed), self.tokens, self.targets, step.optimizer, step.lr
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
        i's expert-parallel group that holds it; sharded between steps, each chunk from the
        data-parallel rank that kept it."""
        params = {}
        replica = self.replicas[i]
        for stage in replica.stages:
            params.update(self._gathered_stage(i, stage) if self.sharded_between_steps else stage.params)
            for name in [n for n in stage.params if ".moe.expert" in n] if self.ep > 1 else []:
                params[name] = self._expert_holder(i, name).stages[stage.stage].params[name]
        return params

    def _expert_holder(self, i: int, name: str) -> PipelineNumerics:
        """The pipeline of i's expert-parallel group (and tensor-parallel rank) holding expert `name`."""
        assert self.cfg.moe is not None
        e = int(name.split(".")[2][len("expert") :])  # layer{L}.moe.expert{e}.fc.w
        first = i // self.tp // self.ep * self.ep
        return self.replicas[(first + e // (self.cfg.moe.num_experts // self.ep)) * self.tp + i % self.tp]

    def _gathered_stage(self, i: int, stage: Stage) -> dict[str, np.ndarray]:
        """Sharded between steps: a stage's parameters put together from every rank's chunks."""
        rank = self.replicas[i].stage_to_rank[stage.stage]
        names = self._names(rank, stage.stage, "grads")
        whole = np.full_like(flat(stage.params, names), np.nan)
        for d in range(self.dp):
            other = self.replicas[d * self.tp + i % self.tp]
            holder = other.stage_to_rank[stage.stage]
            own = flat(other.stages[stage.stage].params, names)
            for lo, hi in self.buckets.bounds("grads", stage.stage, whole.size):
                a, b = self._chunk(holder, "grads", lo, hi)
                whole[a:b] = own[a:b]
        view = {name: np.empty_like(value) for name, value in stage.params.items()}
        unflat(whole, view, names)
        return view


def _data_parallel_tag(op: Collective) -> GradBucket | ParamBucket | ParamGather:
    if not isinstance(op.tag, GradBucket | ParamBucket | ParamGather):
        raise RuntimeError(f"{op.label}: not a data-parallel collective this numerics knows")
    return op.tag
