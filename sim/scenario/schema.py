"""The one strict validation point: scenario YAML -> a frozen, typed, SI-unit `Scenario`.

    scenario = load_scenario("scenarios/quickstart.yaml")   # sim.scenario.loader
    scenario.parallel.pp, scenario.num_microbatches, scenario.gpu_spec.peak_flops

Every problem (missing file, YAML syntax, unknown key, wrong type, bad value, inconsistent
fields) is a `ScenarioError` whose str is one line: `{file}: {field.path}: {reason}`.
Types are strict: "4" is not 4 and 4.0 is not an int. Unit strings ("300GB/s", "1us", "80GiB",
"312TFLOPS") are parsed by sim.scenario.units (through sim.scenario.fields) and nowhere else;
attribute names carry the unit (`link_bandwidth_Bps`), YAML keys do not (`link_bandwidth`).
The sections live in sim.scenario.sections, .model and .topology; this module holds the rules
that cross sections. `sim.scenario.json_schema` is the format's reference; scenarios/quickstart.yaml
is an example of every section.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from clustersim.schedules.pipeline import SCHEDULES, ScheduleError
from clustersim.sim.collectives import nccl_versions
from clustersim.sim.scenario.chips import CHIPS
from clustersim.sim.scenario.errors import FieldError, ScenarioError, show_value
from clustersim.sim.scenario.expert_rules import check_expert_parallel
from clustersim.sim.scenario.fields import Section, one_of
from clustersim.sim.scenario.hardware import GpuSpec
from clustersim.sim.scenario.megatron_section import check_overlap_param_gather, check_tp_comm_overlap
from clustersim.sim.scenario.model import ModelSection
from clustersim.sim.scenario.presets import ModelSpec
from clustersim.sim.scenario.sections import (
    ClusterSection,
    NumericsSection,
    OutputSection,
    ParallelSection,
    TrainingSection,
)
from clustersim.sim.scenario.topology import resolved_topology

__all__ = ["Scenario", "ScenarioError", "FieldError", "show_value"]

SCHEDULE_NAMES = tuple(SCHEDULES)
NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
MAX_NAME_CHARS = 100  # it names a folder (runs/<name>) and files; file systems stop at 255 bytes
if TYPE_CHECKING:
    ScheduleName = str
else:
    ScheduleName = one_of(SCHEDULE_NAMES, "schedule")


class Scenario(Section):
    """A validated scenario. Sections are frozen; derived values are properties."""

    name: str = Field(max_length=MAX_NAME_CHARS, json_schema_extra={"pattern": NAME_PATTERN})
    cluster: ClusterSection
    model: ModelSection
    training: TrainingSection
    parallel: ParallelSection = ParallelSection()
    schedule: ScheduleName = "1f1b"
    numerics: NumericsSection = NumericsSection()
    output: OutputSection = OutputSection()

    @field_validator("name")
    @classmethod
    def _name_is_a_folder_name(cls, value: str) -> str:
        if not re.match(NAME_PATTERN, value):
            raise ValueError(f"{show_value(value)} is not a valid name: use only letters, digits, '_', '.', '-'")
        if value in (".", ".."):
            raise ValueError(f"'{value}' is not a valid name: it names a folder that already exists")
        return value

    @model_validator(mode="after")
    def _cross_field_checks(self) -> Scenario:
        m, p, t, c = self.model, self.parallel, self.training, self.cluster
        if p.stage_layers is not None:
            if len(p.stage_layers) != p.num_stages or sum(p.stage_layers) != m.layers:
                raise FieldError(
                    "parallel.stage_layers",
                    (
                        f"{len(p.stage_layers)} stages of {sum(p.stage_layers)} layers: give one count per stage, "
                        f"parallel.pp ({p.pp}) x parallel.virtual ({p.virtual}) = {p.num_stages}, summing to "
                        f"model.layers ({m.layers})"
                    ),
                )
        elif m.layers % p.pp:
            raise FieldError("parallel.pp", f"{p.pp} does not divide model.layers ({m.layers})")
        elif m.layers % p.num_stages:
            raise FieldError(
                "parallel.virtual",
                (
                    f"parallel.pp ({p.pp}) x parallel.virtual ({p.virtual}) = {p.num_stages} stages "
                    f"does not divide model.layers ({m.layers})"
                ),
            )
        if m.heads % p.tp:
            raise FieldError("parallel.tp", f"{p.tp} does not divide model.heads ({m.heads})")
        if m.kv_heads is not None and m.kv_heads % p.tp:  # Megatron: num_query_groups % tp == 0
            raise FieldError("parallel.tp", f"{p.tp} does not divide model.kv_heads ({m.kv_heads})")
        if m.ffn % p.tp:
            raise FieldError("parallel.tp", f"{p.tp} does not divide model.ffn ({m.ffn})")
        check_expert_parallel(self.model, self.model_spec.seq_len, self.parallel, self.training, self.numerics)
        if self.parallel.megatron.moe_dispatcher == "flex" and self.cluster.nccl is None:
            raise FieldError("parallel.megatron.moe_dispatcher", "flex needs the NCCL layer (set cluster.nccl)")
        if p.world_size != c.num_gpus:
            raise FieldError(
                "parallel",
                (
                    f"pp({p.pp}) x tp({p.tp}) x dp({p.dp}) = {p.world_size} != {c.num_gpus} GPUs "
                    f"(cluster.nodes {c.nodes} x cluster.gpus_per_node {c.gpus_per_node})"
                ),
            )
        per_step = t.micro_batch * p.dp
        if t.global_batch < per_step:
            raise FieldError(
                "training.global_batch",
                (
                    f"{t.global_batch} < training.micro_batch ({t.micro_batch}) x parallel.dp ({p.dp})"
                    f" = {per_step}: less than one microbatch per data-parallel replica"
                ),
            )
        if t.global_batch % per_step:
            raise FieldError(
                "training.global_batch",
                (
                    f"{t.global_batch} is not divisible by training.micro_batch ({t.micro_batch})"
                    f" x parallel.dp ({p.dp}) = {per_step}"
                ),
            )
        try:  # the schedule's own rules (schedules.pipeline.SCHEDULES)
            SCHEDULES[self.schedule].check(self.schedule, p.pp, self.num_microbatches, p.virtual)
        except ScheduleError as exc:
            if exc.knob == "virtual":
                raise FieldError("parallel.virtual", str(exc)) from None
            raise FieldError(
                "training.global_batch",
                (
                    f"{t.global_batch} / (training.micro_batch ({t.micro_batch}) x parallel.dp ({p.dp})) = "
                    f"{self.num_microbatches} microbatches: {exc}"
                ),
            ) from None
        n, group = self.numerics, self.model_spec.heads // (self.model_spec.kv_heads or self.model_spec.heads)
        if n.enabled and n.heads % group:  # the shadow model's query heads share keys as the real one's
            raise FieldError("numerics.heads", f"{n.heads} is not a multiple of model.heads / model.kv_heads ({group})")
        if n.enabled and p.tp > 1:  # the shadow model is sharded like the real one (ffn = 4 x hidden)
            for knob, size in (("heads", n.heads), ("vocab", n.vocab)):
                if size % p.tp:
                    raise FieldError(
                        f"numerics.{knob}",
                        f"{size} is not divisible by parallel.tp ({p.tp}): the "
                        "shadow model is sharded the same way as the real one",
                    )
            if n.heads // group % p.tp:
                raise FieldError(
                    "numerics.heads",
                    f"{n.heads} heads in groups of {group} give {n.heads // group} key-value heads, not divisible "
                    f"by parallel.tp ({p.tp})",
                )
            if p.sequence_parallel and n.seq_len % p.tp:
                raise FieldError(
                    "numerics.seq_len",
                    f"{n.seq_len} is not divisible by parallel.tp ({p.tp}): "
                    "sequence parallelism splits the shadow model's sequence too",
                )
        if p.sequence_parallel and p.tp == 1:
            raise FieldError(
                "parallel.sequence_parallel", "needs parallel.tp > 1 (it splits the tensor-parallel group's sequence)"
            )
        if t.fp8:
            self._check_fp8()
        kernel, units = self.cluster.compute_model == "kernel", CHIPS[self.cluster.gpu].compute_units
        check_tp_comm_overlap(p.megatron, p.tp, p.sequence_parallel, kernel, units)
        check_overlap_param_gather(p.megatron, p.zero)
        return self

    def _check_fp8(self) -> None:
        """FP8 GEMMs are the kernel model's (their rate comes from a measured FP8 matmul ceiling)."""
        if self.cluster.compute_model != "kernel":
            raise FieldError("training.fp8", "needs cluster.compute_model: kernel (FP8 GEMMs are timed per kernel)")
        if CHIPS[self.cluster.gpu].fp8_matmul_ceiling is None:
            known = ", ".join(name for name, chip in CHIPS.items() if chip.fp8_matmul_ceiling is not None)
            raise FieldError(
                "training.fp8",
                f"needs FP8 tensor cores with a measured FP8 matmul ceiling: {known}, not {self.cluster.gpu}",
            )

    @property
    def num_gpus(self) -> int:
        return self.cluster.num_gpus

    @property
    def num_microbatches(self) -> int:
        """Microbatches per step per data-parallel replica: global_batch / (micro_batch x dp)."""
        return self.training.global_batch // (self.training.micro_batch * self.parallel.dp)

    @property
    def blocking_p2p(self) -> bool:
        """parallel.megatron.blocking_p2p; unset, as Megatron-LM with the kernel compute model."""
        blocking = self.parallel.megatron.blocking_p2p
        return self.cluster.compute_model == "kernel" if blocking is None else blocking

    @property
    def grad_reduce_in_fp32(self) -> bool:
        """parallel.megatron.grad_reduce_in_fp32; unset, as Megatron-LM and NeMo with bf16 (and the
        kernel compute model, whose bf16 weight gradients are summed into the FP32 buffer)."""
        fp32 = self.parallel.megatron.grad_reduce_in_fp32
        return self.cluster.compute_model == "kernel" and self.training.dtype == "bf16" if fp32 is None else fp32

    @property
    def gradient_bytes(self) -> float:
        """Bytes of one gradient as it is kept and reduced: 4 in FP32, else the 16-bit weights' 2."""
        return 4.0 if self.grad_reduce_in_fp32 else 2.0

    @property
    def model_spec(self) -> ModelSpec:
        return self.model.spec

    @property
    def gpu_spec(self) -> GpuSpec:
        return self.cluster.gpu_spec

    @property
    def dtype_bytes(self) -> int:
        return self.training.dtype_bytes

    @property
    def output_dir(self) -> Path:
        return Path(self.output.dir) if self.output.dir is not None else Path("runs") / self.name

    def resolved(self) -> dict[str, Any]:
        """JSON-friendly and fully resolved: SI floats, preset and GPU overrides merged, derived
        values added (num_gpus, gpu_spec, dtype_bytes, num_microbatches, output dir)."""
        data = self.model_dump(mode="json")
        data["cluster"]["topology"] = resolved_topology(self.cluster.topology)
        for (*outer, key), default in _LATER_KEYS:  # absent at their defaults, as before they existed
            section = functools.reduce(lambda d, k: d.get(k) or {}, outer, data)
            if key in section and section[key] == default:
                del section[key]
        data["cluster"]["num_gpus"] = self.num_gpus
        data["cluster"]["gpu_spec"] = dataclasses.asdict(self.gpu_spec)
        data["training"]["dtype_bytes"] = self.dtype_bytes
        data["training"]["num_microbatches"] = self.num_microbatches
        data["output"]["dir"] = self.output_dir.as_posix()
        return data


_LATER_KEYS = (  # (path, default) of keys added after the first summaries were saved
    (("cluster", "nccl"), None),
    (("cluster", "nccl", "version"), nccl_versions.LATEST),
    (("cluster", "compute_model"), "roofline"),
    (("training", "flash_attention"), False),
    (("training", "fp8"), False),
    (("model", "kv_heads"), None),
    (("model", "head_dim"), None),
    (("model", "qk_norm"), False),
    (("model", "hidden_dropout"), 0.1),
    (("model", "attention_dropout"), 0.1),
    (("parallel", "megatron", "blocking_p2p"), None),
    (("parallel", "megatron", "grad_reduce_in_fp32"), None),
    (("parallel", "megatron", "moe_dispatcher"), "alltoall"),
    (("parallel", "stage_layers"), None),
)
