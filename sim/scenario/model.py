"""The `model` section: the model's shape, from a preset or spelled out, and its Mixture-of-Experts MLP."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from clustersim.sim.scenario.errors import FieldError
from clustersim.sim.scenario.fields import Section, finite, is_int
from clustersim.sim.scenario.presets import MODELS, ModelSpec, MoESpec

# Sane maxima (STYLE habit 6): far above any published model, low enough that the FLOP and byte
# counts built from them stay exact and finite.
MAX_LAYERS = 100_000
MAX_WIDTH = 2**20  # hidden, heads, ffn, expert_ffn
MAX_SEQ_LEN = 2**24
MAX_VOCAB = 2**24
MAX_EXPERTS = 2**16
MAX_CAPACITY_FACTOR = 1000.0


class MoESection(Section):
    """Mixture-of-Experts MLP (sim.presets.MoESpec): layer i is an MoE layer when i >= first_dense
    and i % every == every - 1; the other layers keep the dense MLP of width model.ffn. With a
    preset, the keys given override the preset's one by one (`moe: null` makes the model dense)."""

    num_experts: int = Field(alias="experts", gt=0, le=MAX_EXPERTS, description="routed experts per MoE layer")
    top_k: int = Field(gt=0, le=MAX_EXPERTS, description="routed experts each token goes to (<= experts)")
    capacity_factor: Annotated[float, Field(gt=0), AfterValidator(finite), Field(le=MAX_CAPACITY_FACTOR)] | None = (
        Field(
            None,
            description="expert buffer = ceil(factor x tokens x top_k / experts) rows, tokens past it "
            "are dropped; null (default): no dropping",
        )
    )
    every: int = Field(
        1, gt=0, le=MAX_LAYERS, description="MoE in every n-th layer: layers i with i % every == every - 1"
    )
    first_dense: int = Field(0, ge=0, le=MAX_LAYERS, description="this many first layers stay dense (DeepSeek-V3: 3)")
    expert_ffn: int = Field(gt=0, le=MAX_WIDTH, description="each expert's MLP width (default model.ffn)")
    shared_experts: int = Field(
        0, ge=0, le=MAX_EXPERTS, description="always-on experts of width expert_ffn (DeepSeekMoE)"
    )
    expert_groups: int = Field(
        1, gt=0, le=MAX_EXPERTS, description="the experts in this many equal blocks (DeepSeek-V3: 8, one per node)"
    )
    limited_groups: int | None = Field(
        None,
        gt=0,
        le=MAX_EXPERTS,
        description="node-limited routing: each token's experts within its best this-many blocks "
        "(DeepSeek-V3: 4); null (default): no limit",
    )

    @model_validator(mode="after")
    def _top_k_fits(self) -> MoESection:
        if self.top_k > self.num_experts:
            raise FieldError(
                "top_k",
                f"{self.top_k} > model.moe.experts ({self.num_experts}): a token cannot go "
                "to more experts than there are",
            )
        if self.num_experts % self.expert_groups:
            raise FieldError(
                "expert_groups", f"{self.expert_groups} does not divide model.moe.experts ({self.num_experts})"
            )
        if self.limited_groups is not None:
            if self.limited_groups > self.expert_groups:
                raise FieldError(
                    "limited_groups", f"{self.limited_groups} > model.moe.expert_groups ({self.expert_groups})"
                )
            reachable = self.limited_groups * self.num_experts // self.expert_groups
            if self.top_k > reachable:
                raise FieldError(
                    "limited_groups",
                    f"{self.limited_groups} blocks of {self.num_experts // self.expert_groups} experts hold "
                    f"{reachable}, fewer than model.moe.top_k ({self.top_k})",
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


class ModelSection(Section):
    """Model shape. With `preset`, missing fields come from MODELS[preset] (and missing `moe` keys
    from the preset's MoE); without it, all of layers/hidden/heads/seq_len/vocab are required and
    ffn defaults to 4 x hidden. `moe` (absent or null: a dense model) takes its expert_ffn from ffn
    when not given."""

    # The schema cannot say "required unless preset"; list none as required rather than lie.
    model_config = ConfigDict(json_schema_extra=lambda schema, cls: schema.pop("required", None))

    preset: str | None = Field(None, json_schema_extra={"enum": [*MODELS, None]})
    layers: int = Field(gt=0, le=MAX_LAYERS)
    hidden: int = Field(gt=0, le=MAX_WIDTH)
    heads: int = Field(gt=0, le=MAX_WIDTH)
    ffn: int = Field(gt=0, le=MAX_WIDTH)
    seq_len: int = Field(gt=0, le=MAX_SEQ_LEN)
    vocab: int = Field(gt=0, le=MAX_VOCAB)
    gated_mlp: bool = False
    moe: MoESection | None = None
    kv_heads: int | None = Field(None, gt=0, le=MAX_WIDTH)  # grouped-query attention (Llama 2 70B, Llama 3)
    position_embedding: Literal["learned", "rope"] = Field(
        "learned", description="learned: GPT's table of seq_len rows; rope: rotary embeddings (Llama)"
    )
    head_dim: int | None = Field(
        None,
        gt=0,
        le=MAX_WIDTH,
        description="each attention head's width (Qwen3: 128 at hidden 2048); default hidden / heads",
    )
    qk_norm: bool = Field(False, description="an RMSNorm over each query and key head (Qwen3's qk_layernorm)")
    hidden_dropout: float = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description="dropout after the attention and MLP blocks and the embedding (Megatron's --hidden-dropout); "
        "0: no mask kept, no dropout kernel",
    )
    attention_dropout: float = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description="dropout over the attention probabilities (Megatron's --attention-dropout); 0: none",
    )

    @model_validator(mode="before")
    @classmethod
    def _merge_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data  # pydantic reports "expected a mapping"
        preset = data.get("preset")
        if isinstance(preset, str):
            if preset not in MODELS:
                valid = ", ".join(MODELS)
                raise FieldError("preset", f"unknown preset '{preset}' (valid: {valid})")
            base = {**dataclasses.asdict(MODELS[preset]), "moe": _moe_as_yaml(MODELS[preset].moe)}
            if isinstance(base["moe"], dict) and isinstance(data.get("moe"), dict):
                data = {**data, "moe": {**base["moe"], **data["moe"]}}  # override the preset's MoE key by key
            data = {**base, **data}
        elif "ffn" not in data and is_int(data.get("hidden")):
            data = {**data, "ffn": 4 * data["hidden"]}
        moe = data.get("moe")
        if isinstance(moe, dict) and "expert_ffn" not in moe and is_int(data.get("ffn")):
            data = {**data, "moe": {**moe, "expert_ffn": data["ffn"]}}
        return data

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> ModelSection:
        if self.head_dim is None and self.hidden % self.heads:
            raise FieldError(
                "heads",
                f"{self.heads} does not divide model.hidden ({self.hidden}): give model.head_dim to decouple them",
            )
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise FieldError("kv_heads", f"{self.kv_heads} does not divide model.heads ({self.heads}) into groups")
        return self

    @model_validator(mode="after")
    def _some_layer_is_moe(self) -> ModelSection:
        moe = self.moe
        if moe is not None and not moe.spec.num_moe_layers(self.layers):
            knob = "first_dense" if moe.first_dense >= self.layers else "every"
            raise FieldError(
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
