"""The one strict validation point: scenario YAML -> a frozen, typed, SI-unit `Scenario`.

    scenario = load_scenario("scenarios/quickstart.yaml")   # sim.scenario_loader
    scenario.parallel.pp, scenario.num_microbatches, scenario.gpu_spec.peak_flops

Every problem (missing file, YAML syntax, unknown key, wrong type, bad value, inconsistent
fields) is a `ScenarioError` whose str is one line: `{file}: {field.path}: {reason}`.
Types are strict: "4" is not 4 and 4.0 is not an int. Unit strings ("300GB/s", "1us", "80GiB",
"312TFLOPS") are parsed by sim.units here and nowhere else; attribute names carry the unit
(`link_bandwidth_Bps`), YAML keys do not (`link_bandwidth`). `scenario_json_schema()` is the
format's reference; scenarios/quickstart.yaml is an example of every section.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from clustersim.schedules.pipeline import SCHEDULES, ScheduleError
from clustersim.sim.cost.memory import RECOMPUTE_MODES
from clustersim.sim.scenario import units
from clustersim.sim.scenario.hardware import GPUS, GpuSpec
from clustersim.sim.scenario.presets import MODELS, ModelSpec, MoESpec
from clustersim.topologies import fattree
from clustersim.topologies.registry import TOPOLOGIES

TOPOLOGY_KINDS = tuple(TOPOLOGIES)
SCHEDULE_NAMES = tuple(SCHEDULES)
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
NUMERICS_DTYPES = ("float64", "float32")
OPTIMIZERS = ("adam", "sgd")
NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"


def _escape_controls(text: str) -> str:
    """Control characters (line breaks, tabs, ...) as Python escapes, so the text stays on one line."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: repr(m.group())[1:-1], text)


class ScenarioError(Exception):
    """Bad scenario input. str(err) is one line: `{file}: {path}: {reason}`."""

    def __init__(self, file: str | Path, path: str, reason: str):
        # one line, always: a key or file name may itself hold a line break
        self.file, self.path = _escape_controls(str(file)), _escape_controls(path)
        self.reason = " ".join(str(reason).split())
        super().__init__(f"{self.file}: {self.path}: {self.reason}")


class _FieldError(ValueError):
    """Raised inside a validator to blame `subpath` (relative to the validated model)."""

    def __init__(self, subpath: str, reason: str):
        super().__init__(reason)
        self.subpath = tuple(subpath.split("."))


def _one_of(valid: tuple[str, ...] | dict, what: str) -> Any:
    """A str that must be one of `valid` (a registry dict or a tuple); a miss lists them all."""

    def check(value: str) -> str:
        if value not in valid:
            raise ValueError(f"unknown {what} '{value}' (valid: {', '.join(valid)})")
        return value

    return Annotated[str, AfterValidator(check), Field(json_schema_extra={"enum": list(valid)})]


def _unit(
    parse: Callable[[object], float], pattern: str, example: str, si: str, zero_ok: bool, optional: bool = False
) -> Any:
    """A float field written as a unit string (or a plain SI number), parsed at validation.
    It must be > 0 (>= 0 if zero_ok); the check is here so the message quotes what was written.
    `optional` also accepts null (None)."""

    def parse_checked(value: object) -> float | None:
        if optional and value is None:
            return None
        number = parse(value)
        if number < 0 or (number == 0 and not zero_ok):
            raise ValueError(f"must be {'>=' if zero_ok else '>'} 0, got {show_value(value)}")
        return number

    schema = {
        "anyOf": [{"type": "string", "pattern": pattern, "examples": [example]}, {"type": "number"}],
        "description": f"e.g. '{example}', or a plain number in {si}; {'>=' if zero_ok else '>'} 0",
    }
    if optional:
        schema["anyOf"].append({"type": "null"})
    return Annotated[float | None if optional else float, BeforeValidator(parse_checked), WithJsonSchema(schema)]


Bytes = _unit(units.parse_bytes, units.BYTES_PATTERN, "80GiB", "bytes", False)
Bandwidth = _unit(units.parse_bandwidth, units.BANDWIDTH_PATTERN, "300GB/s", "bytes/s", False)
Seconds = _unit(units.parse_seconds, units.TIME_PATTERN, "1.5us", "seconds", zero_ok=True)
Flops = _unit(units.parse_flops, units.FLOPS_PATTERN, "312TFLOPS", "FLOP/s", False)
OptionalBandwidth = _unit(units.parse_bandwidth, units.BANDWIDTH_PATTERN, "300GB/s", "bytes/s", False, True)
TopologyKind = _one_of(TOPOLOGY_KINDS, "topology kind")
GpuName = _one_of(GPUS, "gpu")
Dtype = _one_of(DTYPE_BYTES, "dtype")
NumericsDtype = _one_of(NUMERICS_DTYPES, "numerics dtype")
OptimizerName = _one_of(OPTIMIZERS, "optimizer")
ScheduleName = _one_of(SCHEDULE_NAMES, "schedule")


def show_value(value: object) -> str:
    """A value as the user wrote it in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# The YAML keys each topology kind takes besides `kind`; every one must end up set (TOPOLOGY_DEFAULTS
# fills some), and a key of another kind is an error. sim.run.build_topology maps them to builders.
TOPOLOGY_KEYS = {
    "switch": ("link_bandwidth", "link_latency"),
    "ring": ("link_bandwidth", "link_latency"),
    "torus": ("axes", "wrap", "link_bandwidth", "link_latency"),
    "mesh": ("axes", "link_bandwidth", "link_latency"),
    "dgx": ("nvlink_bandwidth", "nic_bandwidth", "link_latency"),
    "fattree": (
        "nvlink_bandwidth",
        "nic_bandwidth",
        "leaf_radix",
        "oversubscription",
        "tiers",
        "load_balance",
        "link_latency",
    ),
}
_DGX_DEFAULTS = {"nvlink_bandwidth": fattree.NVLINK4_BANDWIDTH_Bps, "nic_bandwidth": fattree.CX7_BANDWIDTH_Bps}
TOPOLOGY_DEFAULTS = {  # filled in before validation, so the resolved scenario shows what was used
    "torus": {"wrap": True},
    "dgx": _DGX_DEFAULTS,
    "fattree": {
        **_DGX_DEFAULTS,
        "leaf_radix": fattree.LEAF_RADIX,
        "oversubscription": 1.0,
        "tiers": 2,
        "load_balance": "ecmp",
    },
}


LoadBalance = _one_of(fattree.LOAD_BALANCE, "load balance")


class TopologySection(_Section):
    """The fabric (topologies/). Which keys a kind takes: TOPOLOGY_KEYS. GPU count: switch and ring
    take cluster.nodes x cluster.gpus_per_node; torus and mesh need the product of `axes` to equal
    it; dgx is one node; fattree joins cluster.nodes nodes of cluster.gpus_per_node GPUs."""

    kind: TopologyKind = "switch"
    link_bandwidth_Bps: OptionalBandwidth = Field(
        None, alias="link_bandwidth", description="switch, ring, torus, mesh: every link, per direction"
    )
    link_latency_s: Seconds = Field(alias="link_latency", description="every kind: per link, e.g. '1us'")
    axes: list[Annotated[int, Field(gt=0)]] | None = Field(
        None, min_length=1, max_length=3, description="torus, mesh: GPUs per axis, e.g. [4, 4, 4]; axis 0 routes first"
    )
    wrap: bool | None = Field(None, description="torus: wraparound links (default true)")
    nvlink_bandwidth_Bps: OptionalBandwidth = Field(
        None, alias="nvlink_bandwidth", description="dgx, fattree: GPU <-> NVSwitch per direction (default 450GB/s)"
    )
    nic_bandwidth_Bps: OptionalBandwidth = Field(
        None, alias="nic_bandwidth", description="dgx, fattree: GPU <-> NIC <-> leaf per direction (default 50GB/s)"
    )
    leaf_radix: int | None = Field(None, gt=0, description="fattree: NIC ports per leaf switch (default 32)")
    oversubscription: float | None = Field(
        None, gt=0, description="fattree: leaf downlink / uplink capacity (default 1: full bisection)"
    )
    tiers: int | None = Field(None, ge=2, le=3, description="fattree: 2 (leaf, spine) or 3 (+ core) (default 2)")
    load_balance: LoadBalance | None = Field(
        None, description="fattree: ecmp (per-flow hash onto one spine) or adaptive (ideal spraying) (default ecmp)"
    )

    @field_validator("axes", mode="before")
    @classmethod
    def _axes_is_a_short_list(cls, value: Any) -> Any:
        if value is not None and (not isinstance(value, list) or not 1 <= len(value) <= 3):
            got = f"{len(value)} axes" if isinstance(value, list) else show_value(value)
            raise ValueError(f"expected a list of 1 to 3 axis sizes, e.g. [4, 4, 4], got {got}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _kind_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("kind", "switch"), str):
            return {**TOPOLOGY_DEFAULTS.get(data.get("kind", "switch"), {}), **data}
        return data

    @model_validator(mode="after")
    def _keys_fit_kind(self) -> TopologySection:
        takes = TOPOLOGY_KEYS[self.kind]
        for name, field in type(self).model_fields.items():
            key, value = field.alias or name, getattr(self, name)
            if key == "kind":
                continue
            if key not in takes and value is not None:
                raise _FieldError(key, f"not used by topology kind '{self.kind}' (it takes: {', '.join(takes)})")
            if key in takes and value is None:
                raise _FieldError(key, f"required for topology kind '{self.kind}'")
        return self


class GpuOverrides(_Section):
    """Any GpuSpec field; names match GpuSpec so they merge with dataclasses.replace."""

    peak_flops: Flops | None = None
    memory_bytes: Bytes | None = Field(None, alias="memory")
    hbm_bandwidth_Bps: Bandwidth | None = Field(None, alias="hbm_bandwidth")
    efficiency: float | None = Field(None, gt=0, le=1)


class ClusterSection(_Section):
    gpu: GpuName
    gpu_overrides: GpuOverrides = GpuOverrides()
    nodes: int = Field(1, gt=0)
    gpus_per_node: int = Field(gt=0)
    topology: TopologySection

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @model_validator(mode="after")
    def _topology_fits(self) -> ClusterSection:
        t = self.topology
        if t.axes is not None and math.prod(t.axes) != self.num_gpus:
            raise _FieldError(
                "topology.axes",
                (
                    f"{' x '.join(map(str, t.axes))} = {math.prod(t.axes)} GPUs != {self.num_gpus} "
                    f"(cluster.nodes {self.nodes} x cluster.gpus_per_node {self.gpus_per_node})"
                ),
            )
        if t.kind == "dgx" and self.nodes != 1:
            raise _FieldError(
                "nodes", f"{self.nodes}: topology kind 'dgx' is one node; use kind 'fattree' to join several"
            )
        return self

    @property
    def gpu_spec(self) -> GpuSpec:
        """The GPUS entry with every non-null override applied."""
        overrides = {k: v for k, v in self.gpu_overrides.model_dump().items() if v is not None}
        return dataclasses.replace(GPUS[self.gpu], **overrides)


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {show_value(value)}")
    return value


class MoESection(_Section):
    """Mixture-of-Experts MLP (sim.presets.MoESpec): layer i is an MoE layer when i >= first_dense
    and i % every == every - 1; the other layers keep the dense MLP of width model.ffn. With a
    preset, the keys given override the preset's one by one (`moe: null` makes the model dense)."""

    num_experts: int = Field(alias="experts", gt=0, description="routed experts per MoE layer")
    top_k: int = Field(gt=0, description="routed experts each token goes to (<= experts)")
    capacity_factor: Annotated[float, Field(gt=0), AfterValidator(_finite)] | None = Field(
        None,
        description="expert buffer = ceil(factor x tokens x top_k / experts) rows, tokens past it "
        "are dropped; null (default): no dropping",
    )
    every: int = Field(1, gt=0, description="MoE in every n-th layer: layers i with i % every == every - 1")
    first_dense: int = Field(0, ge=0, description="this many first layers stay dense (DeepSeek-V3: 3)")
    expert_ffn: int = Field(gt=0, description="each expert's MLP width (default model.ffn)")
    shared_experts: int = Field(0, ge=0, description="always-on experts of width expert_ffn (DeepSeekMoE)")

    @model_validator(mode="after")
    def _top_k_fits(self) -> MoESection:
        if self.top_k > self.num_experts:
            raise _FieldError(
                "top_k",
                f"{self.top_k} > model.moe.experts ({self.num_experts}): a token cannot go "
                "to more experts than there are",
            )
        return self

    @property
    def spec(self) -> MoESpec:
        return MoESpec(**self.model_dump())


def _moe_as_yaml(moe: MoESpec | None) -> dict[str, Any] | None:
    """A preset's MoESpec under its YAML keys (`experts`, not `num_experts`), for merging."""
    if moe is None:
        return None
    return {MoESection.model_fields[name].alias or name: value for name, value in dataclasses.asdict(moe).items()}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class ModelSection(_Section):
    """Model shape. With `preset`, missing fields come from MODELS[preset] (and missing `moe` keys
    from the preset's MoE); without it, all of layers/hidden/heads/seq_len/vocab are required and
    ffn defaults to 4 x hidden. `moe` (absent or null: a dense model) takes its expert_ffn from ffn
    when not given."""

    # The schema cannot say "required unless preset"; list none as required rather than lie.
    model_config = ConfigDict(json_schema_extra=lambda schema, cls: schema.pop("required", None))

    preset: str | None = Field(None, json_schema_extra={"enum": [*MODELS, None]})
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    ffn: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    vocab: int = Field(gt=0)
    gated_mlp: bool = False
    moe: MoESection | None = None

    @model_validator(mode="before")
    @classmethod
    def _merge_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data  # pydantic reports "expected a mapping"
        preset = data.get("preset")
        if isinstance(preset, str):
            if preset not in MODELS:
                valid = ", ".join(MODELS)
                raise _FieldError("preset", f"unknown preset '{preset}' (valid: {valid})")
            base = {**dataclasses.asdict(MODELS[preset]), "moe": _moe_as_yaml(MODELS[preset].moe)}
            if isinstance(base["moe"], dict) and isinstance(data.get("moe"), dict):
                data = {**data, "moe": {**base["moe"], **data["moe"]}}  # override the preset's MoE key by key
            data = {**base, **data}
        elif "ffn" not in data and _is_int(data.get("hidden")):
            data = {**data, "ffn": 4 * data["hidden"]}
        moe = data.get("moe")
        if isinstance(moe, dict) and "expert_ffn" not in moe and _is_int(data.get("ffn")):
            data = {**data, "moe": {**moe, "expert_ffn": data["ffn"]}}
        return data

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> ModelSection:
        if self.hidden % self.heads:
            raise _FieldError("heads", f"{self.heads} does not divide model.hidden ({self.hidden})")
        return self

    @model_validator(mode="after")
    def _some_layer_is_moe(self) -> ModelSection:
        moe = self.moe
        if moe is not None and not moe.spec.num_moe_layers(self.layers):
            knob = "first_dense" if moe.first_dense >= self.layers else "every"
            raise _FieldError(
                f"moe.{knob}",
                (
                    f"no MoE layer among model.layers ({self.layers}): layer i is MoE when i >= model.moe.first_dense "
                    f"({moe.first_dense}) and i % model.moe.every ({moe.every}) == {moe.every - 1}"
                ),
            )
        return self

    @property
    def spec(self) -> ModelSpec:
        fields = self.model_dump(exclude={"preset", "moe"})
        return ModelSpec(**fields, moe=self.moe.spec if self.moe is not None else None)


Recompute = _one_of(RECOMPUTE_MODES, "recompute mode")


class TrainingSection(_Section):
    global_batch: int = Field(gt=0, description="sequences per optimizer step")
    micro_batch: int = Field(gt=0, description="sequences per microbatch")
    dtype: Dtype = "bf16"
    recompute: Recompute = Field(
        "none",
        description="activation recomputation: none, selective (attention "
        "core, Korthikanti et al.), full (whole layer)",
    )

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


class ParallelSection(_Section):
    pp: int = Field(1, gt=0, description="pipeline-parallel stages")
    tp: int = Field(1, gt=0, description="tensor-parallel ranks (Megatron column/row split)")
    sequence_parallel: bool = Field(
        False,
        description="split layernorm/dropout regions along the sequence: "
        "all-reduces become reduce-scatter + all-gather",
    )
    dp: int = Field(1, gt=0, description="data-parallel replicas")
    virtual: int = Field(1, gt=0, description="virtual pipeline chunks per rank (interleaved schedule)")
    zero: int = Field(
        0,
        ge=0,
        le=3,
        description="ZeRO stage: 0 plain data parallel, 1 optimizer state, 2 + gradients, 3 + weights sharded over dp",
    )
    bucket: Bytes = Field(25 * 2**20, description="gradient bucket size, e.g. '25MiB' (PyTorch DDP's default)")
    order: list[Literal["dp", "pp", "tp"]] = Field(
        ["dp", "pp", "tp"], description="rank layout, slowest to fastest varying axis (default: tp innermost)"
    )
    ep: int = Field(
        1,
        gt=0,
        description="expert-parallel degree: each MoE layer's experts are spread over ep "
        "ranks carved out of the data-parallel group (ep divides dp and "
        "model.moe.experts); each tensor-parallel rank holds its experts whole and routes "
        "1/tp of the tokens",
    )

    @field_validator("order")
    @classmethod
    def _order_names_each_axis_once(cls, value: list[str]) -> list[str]:
        if sorted(value) != ["dp", "pp", "tp"]:
            raise ValueError(f"must name dp, pp and tp once each, got {value}")
        return value

    @property
    def world_size(self) -> int:
        return self.pp * self.tp * self.dp

    @property
    def num_stages(self) -> int:
        """Pipeline stages: pp x virtual (chunk c of rank r is stage c x pp + r)."""
        return self.pp * self.virtual


class NumericsSection(_Section):
    """The small shadow model really computed in numpy to prove the strategy correct."""

    enabled: bool = True
    hidden: int = Field(16, gt=0)
    heads: int = Field(2, gt=0)
    seq_len: int = Field(8, gt=0)
    vocab: int = Field(32, gt=0)
    micro_batch: int = Field(2, gt=0, description="shadow rows per microbatch")
    seed: int = Field(0, ge=0)
    dtype: NumericsDtype = "float64"
    optimizer: OptimizerName = "adam"
    lr: float = Field(1e-3, gt=0)
    hot_expert_bias: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description=(
            "added to expert 0's routing score when choosing experts (not to its weight): a skewed "
            "router whose expert 0 is hot; MoE models only"
        ),
    )

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> NumericsSection:
        if self.hidden % self.heads:
            raise _FieldError("heads", f"{self.heads} does not divide numerics.hidden ({self.hidden})")
        return self


class OutputSection(_Section):
    dir: str | None = Field(None, description="output folder (default runs/<name>)")


class Scenario(_Section):
    """A validated scenario. Sections are frozen; derived values are properties."""

    name: str = Field(json_schema_extra={"pattern": NAME_PATTERN})
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
            raise ValueError(f"'{value}' is not a valid name: use only letters, digits, '_', '.', '-'")
        return value

    @model_validator(mode="after")
    def _cross_field_checks(self) -> Scenario:
        m, p, t, c = self.model, self.parallel, self.training, self.cluster
        if m.layers % p.pp:
            raise _FieldError("parallel.pp", f"{p.pp} does not divide model.layers ({m.layers})")
        if m.layers % p.num_stages:
            raise _FieldError(
                "parallel.virtual",
                (
                    f"parallel.pp ({p.pp}) x parallel.virtual ({p.virtual}) = {p.num_stages} stages "
                    f"does not divide model.layers ({m.layers})"
                ),
            )
        if m.heads % p.tp:
            raise _FieldError("parallel.tp", f"{p.tp} does not divide model.heads ({m.heads})")
        if m.ffn % p.tp:
            raise _FieldError("parallel.tp", f"{p.tp} does not divide model.ffn ({m.ffn})")
        self._check_expert_parallel()
        if p.world_size != c.num_gpus:
            raise _FieldError(
                "parallel",
                (
                    f"pp({p.pp}) x tp({p.tp}) x dp({p.dp}) = {p.world_size} != {c.num_gpus} GPUs "
                    f"(cluster.nodes {c.nodes} x cluster.gpus_per_node {c.gpus_per_node})"
                ),
            )
        per_step = t.micro_batch * p.dp
        if t.global_batch < per_step:
            raise _FieldError(
                "training.global_batch",
                (
                    f"{t.global_batch} < training.micro_batch ({t.micro_batch}) x parallel.dp ({p.dp})"
                    f" = {per_step}: less than one microbatch per data-parallel replica"
                ),
            )
        if t.global_batch % per_step:
            raise _FieldError(
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
                raise _FieldError("parallel.virtual", str(exc)) from None
            raise _FieldError(
                "training.global_batch",
                (
                    f"{t.global_batch} / (training.micro_batch ({t.micro_batch}) x parallel.dp ({p.dp})) = "
                    f"{self.num_microbatches} microbatches: {exc}"
                ),
            ) from None
        n = self.numerics
        if n.enabled and p.tp > 1:  # the shadow model is sharded like the real one (ffn = 4 x hidden)
            for knob, size in (("heads", n.heads), ("vocab", n.vocab)):
                if size % p.tp:
                    raise _FieldError(
                        f"numerics.{knob}",
                        f"{size} is not divisible by parallel.tp ({p.tp}): the "
                        "shadow model is sharded the same way as the real one",
                    )
            if p.sequence_parallel and n.seq_len % p.tp:
                raise _FieldError(
                    "numerics.seq_len",
                    f"{n.seq_len} is not divisible by parallel.tp ({p.tp}): "
                    "sequence parallelism splits the shadow model's sequence too",
                )
        if p.sequence_parallel and p.tp == 1:
            raise _FieldError(
                "parallel.sequence_parallel", "needs parallel.tp > 1 (it splits the tensor-parallel group's sequence)"
            )
        return self

    def _check_expert_parallel(self) -> None:
        """Layout rule (DeepSpeed-MoE; Megatron-Core's expert parallelism with expert tensor parallel
        1): the dp ranks holding one (stage, tp shard) form dp / ep expert-parallel groups of ep
        consecutive dp indices; EP rank r of a group holds experts r E/ep .. (r + 1) E/ep - 1 of
        every MoE layer whole. A tensor-parallel group splits an MoE layer's tokens, not its
        experts: each of its tp ranks routes and dispatches 1/tp of a microbatch's tokens, so tp
        must divide them, and the experts' gradients are summed over the tp ranks, then reduced
        among the dp / ep ranks holding the same experts (which also share their ZeRO shards). So
        ep must divide both dp and the expert count. (Megatron-Core can also spread the experts
        over the tp ranks, ep | dp x tp; that layout is not modelled.)"""
        m, p = self.model, self.parallel
        if m.moe is None:
            if p.ep > 1:
                raise _FieldError("parallel.ep", f"{p.ep} needs an MoE model (set model.moe); this model is dense")
            if self.numerics.hot_expert_bias:
                raise _FieldError("numerics.hot_expert_bias", "needs an MoE model (set model.moe); this model is dense")
            return
        if m.moe.num_experts % p.ep:
            raise _FieldError("parallel.ep", f"{p.ep} does not divide model.moe.experts ({m.moe.num_experts})")
        if p.dp % p.ep:
            raise _FieldError(
                "parallel.ep",
                (
                    f"{p.ep} does not divide parallel.dp ({p.dp}): expert-parallel groups are carved out of the "
                    "data-parallel group"
                ),
            )
        t, n = self.training, self.numerics
        if (t.micro_batch * self.model_spec.seq_len) % p.tp:
            raise _FieldError(
                "parallel.tp",
                (
                    f"{p.tp} does not divide training.micro_batch ({t.micro_batch}) x model.seq_len "
                    f"({self.model_spec.seq_len}) = {t.micro_batch * self.model_spec.seq_len} tokens: each "
                    "tensor-parallel rank routes 1/tp of a microbatch's tokens to the experts"
                ),
            )
        if p.ep > 1 and p.zero == 3:
            raise _FieldError(
                "parallel.zero",
                "3 with parallel.ep > 1 is not modelled yet (ZeRO 3 gathers of "
                "expert weights among the ranks holding them); use zero 0, 1 or 2",
            )
        if n.enabled and (n.micro_batch * n.seq_len) % p.tp:
            raise _FieldError(
                "numerics.seq_len",
                (
                    f"{n.seq_len} x numerics.micro_batch ({n.micro_batch}) = {n.micro_batch * n.seq_len} tokens is "
                    f"not divisible by parallel.tp ({p.tp}): each tensor-parallel rank of the shadow model routes "
                    "1/tp of a microbatch's tokens"
                ),
            )
        if n.enabled and m.moe.shared_experts > 1:  # what the shadow model's experts can do so far
            raise _FieldError(
                "numerics.enabled",
                "the shadow model's experts do not support more than one shared "
                "expert yet: set numerics.enabled: false (the MoE layers are still timed)",
            )

    @property
    def num_gpus(self) -> int:
        return self.cluster.num_gpus

    @property
    def num_microbatches(self) -> int:
        """Microbatches per step per data-parallel replica: global_batch / (micro_batch x dp)."""
        return self.training.global_batch // (self.training.micro_batch * self.parallel.dp)

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
        data["cluster"]["num_gpus"] = self.num_gpus
        data["cluster"]["gpu_spec"] = dataclasses.asdict(self.gpu_spec)
        data["training"]["dtype_bytes"] = self.dtype_bytes
        data["training"]["num_microbatches"] = self.num_microbatches
        data["output"]["dir"] = self.output_dir.as_posix()
        return data


def scenario_json_schema() -> dict[str, Any]:
    """JSON schema of the YAML format (YAML key names), for `clustersim schema` and editors."""
    schema = Scenario.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
