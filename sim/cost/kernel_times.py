"""The per-kernel compute model's time of every compute op of a scenario (cluster.compute_model:
kernel), and the same time by kernel class for the step-time breakdown.

An F or B op is the work items of its stage (schedules.tensor_parallel.tp_stage_plan: all of them
for a whole op, piece `part` of an op tensor parallelism cut); each item is its kernels
(sim.cost.kernels): a forward item its forward kernels, a backward item its backward kernels, less
the weight gradients when a zero-bubble schedule splits them off into a W op, plus the attention
core's forward again under selective recompute (full recompute: tp_stage_plan already puts the
forward items in the backward). A W op is the weight gradients of its stage's backward items, an
R op the recompute alone, OPT Megatron-LM's optimizer passes over the op's parameters
(sim.cost.optimizer_step). Whichever op holds weight gradients also pays their accumulation over
microbatches where the dtype's code path makes it a pass of its own (optimizer_step.
accumulation_bytes; a stage's first backward is taken to be microbatch 0's, as in every order
with backwards in microbatch order). op.flops stays the counted
model FLOPs (MFU); only the time comes from here. Times are computed once per (phase, stage, part,
split, bytes) and looked up per op: a 16,384-GPU run asks millions of times.

With Transformer Engine's overlap (parallel.megatron.tp_comm_overlap) a dense sublayer's items
come in segments cut at its two overlapped GEMMs (schedules.tp_overlap): ENTRY_EXIT names them. A
share of a GEMM is that share of its time, FLOPs and weights (TE's chunks are GEMMs of 1/t or 1/4
of the rows; their own wave quantisation and launch gaps are not modelled), and a pipelined
reduce-scatter's GEMM runs on the SMs its kernels leave (ChipSpec.gemm_units).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from fractions import Fraction

from clustersim.schedules.ir import Compute, Phase, Program
from clustersim.schedules.order import split_steps
from clustersim.schedules.pipeline import rank_order
from clustersim.schedules.stage_pieces import UNIT_ITEM
from clustersim.schedules.tp_overlap import parse_segment
from clustersim.sim.cost.kernel import KERNEL_CLASSES, Kernel
from clustersim.sim.cost.kernels import LayerKernels
from clustersim.sim.cost.optimizer_step import accumulation_bytes, accumulation_kernels, optimizer_kernels
from clustersim.sim.cost.shapes import Shapes
from clustersim.sim.cost.stages import tensor_parallel_item_flops, tensor_parallel_item_weight_flops
from clustersim.sim.cost.units import tensor_parallel_plan
from clustersim.sim.scenario.chips import CHIPS
from clustersim.sim.scenario.schema import Scenario

# (phase, stage, part, split backward, nbytes, accumulation bytes per weight element)
Key = tuple[Phase, int, int | None, bool, float, int]
# each sublayer item's GEMMs beside its all-gather (ring exchange) and its reduce-scatter (pipeline
# forward, bulk backward), by kernel name (sim.cost.kernels), and the ub_cfg name of a pipelined one
ENTRY_EXIT = {
    "F.attn": ("QKV", "attention projection"),
    "F.mlp": ("FC1", "FC2"),
    "B.attn": ("attention projection dgrad", "QKV wgrad"),
    "B.mlp": ("FC2 dgrad", "FC1 wgrad"),
}
PIPELINED_GEMMS = {"F.attn": "proj_fprop", "F.mlp": "fc2_fprop"}


def shapes_of(scenario: Scenario) -> Shapes:
    """The shapes one tensor-parallel rank's kernels see in this scenario."""
    m, p, t = scenario.model_spec, scenario.parallel, scenario.training
    model = (m.seq_len, m.hidden, m.heads, m.ffn, m.vocab)
    return Shapes(
        t.micro_batch,
        *model,
        p.tp,
        p.sequence_parallel,
        m.gated_mlp,
        t.flash_attention,
        scenario.dtype_bytes,
        m.moe,
        p.ep,
        t.fp8,
        m.kv_hidden,
        # Weight gradients summed inside their GEMMs into an FP32 buffer, whose epilogue then reads
        # and writes 4 bytes per result: Megatron-LM's gradient-accumulation fusion, which its bf16
        # runs use (sim.cost.optimizer_step) and NeMo's configs turn on (NVIDIA/NeMo-Framework-
        # Launcher launcher_scripts/conf/training/gpt3/5b.yaml, llama/llama2_7b.yaml:
        # gradient_accumulation_fusion with megatron_amp_O2; Transformer Engine's
        # fuse_wgrad_accumulation, for FP8 GEMMs too): the FP32 gradients of grad_reduce_in_fp32.
        scenario.grad_reduce_in_fp32,
        m.position_embedding == "rope",
        m.q_hidden,
        m.qk_norm,
        m.hidden_dropout > 0,
        m.attention_dropout > 0,
    )


class KernelTimes:
    """Seconds by kernel class (KERNEL_CLASSES order) of each compute op of one scenario."""

    def __init__(self, scenario: Scenario):
        self.scenario = scenario
        self.chip, self.gpu = CHIPS[scenario.cluster.gpu], scenario.gpu_spec
        layer = LayerKernels(self.chip, self.gpu, shapes_of(scenario))
        names = ("attn", "mlp", "embed", "head") + (("router", "experts") if scenario.model_spec.moe else ())
        self.items = {name: layer.item(name) for name in names}
        self._classes: dict[Key, tuple[float, ...]] = {}
        self.plan = tensor_parallel_plan(scenario)
        sms = scenario.parallel.megatron.tp_comm_overlap_sms.model_dump()
        self.pipelined = {  # a pipelined reduce-scatter's GEMM, on the SMs its kernels leave
            item: self._exit(
                item, layer.on_chip(dataclasses.replace(self.chip, gemm_units=self.chip.compute_units - n))
            )
            for item, name in PIPELINED_GEMMS.items()
            if (n := sms[name])
        }

    @staticmethod
    def _exit(item: str, layer: LayerKernels) -> Kernel:
        """The overlapped exit GEMM of forward item `item` on `layer`'s chip."""
        forward = layer.item(item.split(".")[1]).forward
        return next(k for k in forward if k.name == ENTRY_EXIT[item][1])

    @functools.cached_property
    def split(self) -> set[tuple[int, int]]:
        """(microbatch, stage) of the backwards the schedule splits into B and W."""
        s, p = self.scenario, self.scenario.parallel
        return split_steps(rank_order(s.schedule, p.pp, s.num_microbatches, p.virtual))

    def _pieces(self, phase: Phase, stage: int, recompute_full: bool) -> list[list[str]]:
        """The work items of each piece the program cuts the op into (sim.cost.units.tensor_parallel_plan)."""
        p = self.scenario.parallel
        plan = dataclasses.replace(self.plan, recompute_full=recompute_full)
        return [list(items) for items, _, _ in plan.stage_plan(phase, stage, p.num_stages, p.tp, p.ep)]

    def _item_kernels(self, item: str, split: bool) -> list[Kernel]:
        """A work item's kernels, or a segment's (schedules.tp_overlap); `split`: less the W part."""
        if item == UNIT_ITEM:  # no work: where a unit starts
            return []
        whole, segment, share = parse_segment(item)
        phase, name = whole.split(".")
        kernels = list(self.items[name].forward if phase == "F" else self.items[name].backward)
        redo = self._recomputed_core() if whole == "B.attn" else []
        if segment is None:
            kernels += redo
        else:
            kernels = self._segment(whole, segment, share, kernels) + (redo if segment == "mid" else [])
        return [k for k in kernels if not (split and k.part == "W")]

    def _segment(self, item: str, segment: str, share: Fraction, kernels: list[Kernel]) -> list[Kernel]:
        """Segment `segment` of `item`'s kernels, cut at its overlapped GEMMs (ENTRY_EXIT)."""
        entry, exit_ = (next(i for i, k in enumerate(kernels) if k.name == n) for n in ENTRY_EXIT[item])
        if segment == "exit" and item in self.pipelined:
            kernels = kernels[:exit_] + [self.pipelined[item]] + kernels[exit_ + 1 :]
        lo, hi = {"pre": (0, entry), "entry": (entry, entry + 1), "mid": (entry + 1, exit_)}.get(
            segment, (exit_, exit_ + 1) if segment == "exit" else (exit_ + 1, len(kernels))
        )
        if share == 1:
            return kernels[lo:hi]
        f = float(share)
        return [
            dataclasses.replace(k, time_s=k.time_s * f, flops=k.flops * f, weights=k.weights * f)
            for k in kernels[lo:hi]
        ]

    def segment_flops(self, flops: Callable[[str, int], float], weights: bool = False) -> Callable[[str, int], float]:
        """`flops` (a whole work item's FLOPs, or with `weights` its weight gradient's) shared among
        the item's segments as their kernels' FLOPs are."""

        def share(item: str, stage: int) -> float:
            whole, segment, _ = parse_segment(item)
            if segment is None:
                return flops(item, stage)
            parts = ("W",) if weights else ("F", "B", "W")
            total = sum(k.flops for k in self._item_kernels(whole, False) if k.part in parts)
            mine = sum(k.flops for k in self._item_kernels(item, False) if k.part in parts)
            return flops(whole, stage) * mine / total if total else 0.0

        return share

    def _recomputed_core(self) -> list[Kernel]:
        """The attention core's forward kernels under selective recompute, else none."""
        return list(self.items["attn"].core) if self.scenario.training.recompute == "selective" else []

    def _kernels(
        self, phase: Phase, stage: int, part: int | None, split: bool, nbytes: float, per_weight: int = 0
    ) -> list[Kernel]:
        kernels = self._op_kernels(phase, stage, part, split, nbytes)
        weights = sum(k.weights for k in kernels if k.part == "W")
        return kernels + accumulation_kernels(self.chip, self.gpu, weights, per_weight)

    def _op_kernels(self, phase: Phase, stage: int, part: int | None, split: bool, nbytes: float) -> list[Kernel]:
        full = self.scenario.training.recompute == "full"
        if phase == Phase.OPT:
            return optimizer_kernels(self.chip, self.gpu, nbytes, self.scenario.training.dtype)
        if phase == Phase.W:
            items = [i for piece in self._pieces(Phase.B, stage, False) for i in piece]
            return [k for i in items for k in self._item_kernels(i, False) if k.part == "W"]
        if phase == Phase.R:  # what the backward recomputes: the forward (full), the attention core (selective)
            forward = [i for piece in self._pieces(Phase.F, stage, False) for i in piece]
            if full:
                return [k for i in forward for k in self._item_kernels(i, False)]
            return [k for i in forward if i == "F.attn" for k in self._recomputed_core()]
        pieces = self._pieces(phase, stage, full)
        items = pieces[part] if part is not None else [i for piece in pieces for i in piece]
        return [k for i in items for k in self._item_kernels(i, split)]

    def whole_op_s(self, phase: Phase, stage: int) -> float:
        """Seconds of a stage's whole F or unsplit B op (the planner's estimate, sim.plan.estimate)."""
        return sum(k.time_s for k in self._kernels(phase, stage, None, False, 0.0))

    @functools.cached_property
    def _per_weight(self) -> tuple[int, int]:
        """accumulation_bytes of a stage's later backwards and of its first."""
        dtype = self.scenario.training.dtype
        return accumulation_bytes(dtype, False), accumulation_bytes(dtype, True)

    def _key(self, op: Compute) -> Key:
        """What an op's time depends on; asked for every compute op a run walks (millions), so the
        weight gradients' accumulation bytes are looked up, not worked out."""
        phase = op.phase
        if phase is Phase.B:
            split = (op.microbatch, op.stage) in self.split if self.split else False
            return (phase, op.stage, op.part, split, op.nbytes, 0 if split else self._per_weight[op.microbatch == 0])
        per_weight = self._per_weight[op.microbatch == 0] if phase is Phase.W else 0
        return (phase, op.stage, op.part, False, op.nbytes, per_weight)

    def kernels_of(self, op: Compute) -> list[Kernel]:
        """The kernels an op runs, in order."""
        return self._kernels(*self._key(op))

    def classes_s(self, op: Compute) -> tuple[float, ...]:
        """The op's seconds in each kernel class (KERNEL_CLASSES order)."""
        key = self._key(op)
        if (found := self._classes.get(key)) is None:
            kernels = self._kernels(*key)
            found = self._classes[key] = tuple(sum(k.time_s for k in kernels if k.klass == c) for c in KERNEL_CLASSES)
        return found

    def time_fn(self) -> Callable[[Compute], float]:
        """Compute op -> seconds, one look-up per op after the first of its kind."""
        times: dict[Key, float] = {}

        def time_s(op: Compute) -> float:
            key = self._key(op)
            if (t := times.get(key)) is None:
                t = times[key] = sum(self.classes_s(op))
            return t

        return time_s

    def by_class_s(self, program: Program, rank: int) -> dict[str, float]:
        """A rank's compute seconds per kernel class (its compute ops run one after another on its
        compute stream, so their sum is its compute time)."""
        totals = [0.0] * len(KERNEL_CLASSES)
        classes_s, slots = self.classes_s, range(len(KERNEL_CLASSES))
        for op in program.ops[rank]:
            if type(op) is Compute:  # in place, op after op: the sums of a list rebuilt per op, faster
                seconds = classes_s(op)
                for i in slots:
                    totals[i] += seconds[i]
        return dict(zip(KERNEL_CLASSES, totals, strict=True))


def piece_item_flops(scenario: Scenario) -> tuple[Callable[[str, int], float], Callable[[str, int], float]]:
    """The FLOPs of each work item of a cut stage op and of its weight gradient (sim.cost.stages);
    with tp_comm_overlap, of each segment too, as its kernels' (KernelTimes.segment_flops)."""
    flops, weights = tensor_parallel_item_flops(scenario), tensor_parallel_item_weight_flops(scenario)
    if not scenario.parallel.megatron.tp_comm_overlap:
        return flops, weights
    times = KernelTimes(scenario)
    return times.segment_flops(flops), times.segment_flops(weights, weights=True)
