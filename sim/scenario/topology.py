"""`cluster.topology`: every registered kind's keys (topologies.kind) as a scenario section.

Each kind declares its keys as a pydantic model in SI units; here each becomes a section of the
YAML format, `kind` first, its `Bandwidth` / `Seconds` fields re-typed to parse unit strings
("450GB/s", "1us") and the model a subclass of the kind's own, so a builder gets what it declared.
Which section applies is `kind` (default switch). Keys another kind takes are "not used by" this
one; keys the kind needs and lacks are "required for" it. The same models read the CLI's spec
strings and flags (sim.scenario.spec), so the flags are the YAML keys.
"""

from __future__ import annotations

import difflib
import math
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, Field, create_model
from pydantic.fields import FieldInfo

from clustersim.sim.scenario.errors import FieldError, key_text, show_value
from clustersim.sim.scenario.fields import UNITS
from clustersim.topologies.kind import Keys, Quantity, TopologyKind
from clustersim.topologies.registry import TOPOLOGIES

DEFAULT_KIND = "switch"
MAX_NUMBER = 2**20  # any count or ratio among a kind's keys (a radix, an axis, an oversubscription)

# The keys summary.json's resolved topology listed (null where a kind has no such key) before each
# kind had its own model; kept so summaries saved before then still compare equal, number for number.
SUMMARY_KEYS = (
    "kind",
    "link_bandwidth_Bps",
    "link_latency_s",
    "axes",
    "wrap",
    "nvlink_bandwidth_Bps",
    "nic_bandwidth_Bps",
    "leaf_radix",
    "oversubscription",
    "tiers",
    "load_balance",
)


def _yaml_field(info: FieldInfo) -> tuple[Any, FieldInfo] | None:
    """A field marked with a Quantity, re-typed to parse unit strings; None for the others."""
    quantity = next((m for m in info.metadata if isinstance(m, Quantity)), None)
    if quantity is None:
        return None
    if quantity.unit not in UNITS:
        raise TypeError(f"unknown Quantity unit {quantity.unit!r} (valid: {', '.join(UNITS)})")
    return UNITS[quantity.unit], Field(info.default, alias=info.alias, description=info.description)


def _section(kind: TopologyKind) -> type[Keys]:
    fields: dict[str, Any] = {"kind": (Literal[kind.name], kind.name)}
    for name, info in kind.keys.model_fields.items():
        if (retyped := _yaml_field(info)) is not None:
            fields[name] = retyped
    title = "".join(part.capitalize() for part in kind.name.split("_")) + "Topology"
    return create_model(title, __base__=kind.keys, __doc__=f"cluster.topology with kind: {kind.name}", **fields)


SECTIONS: dict[str, type[Keys]] = {name: _section(kind) for name, kind in TOPOLOGIES.items()}


def yaml_keys(model: type[BaseModel]) -> list[str]:
    """The YAML keys a model takes (aliases where the attribute name carries a unit), `kind` aside."""
    return [field.alias or name for name, field in model.model_fields.items() if name != "kind"]


ALL_KEYS = list(dict.fromkeys(key for kind in TOPOLOGIES.values() for key in yaml_keys(kind.keys)))


def check_keys(data: Any) -> Any:
    """Before validation: a known kind (default switch), only its keys, all its required ones."""
    if not isinstance(data, dict):
        return data  # pydantic says "expected a mapping"
    data = {"kind": DEFAULT_KIND, **data}
    kind = data["kind"]
    if not isinstance(kind, str) or kind not in TOPOLOGIES:
        raise FieldError("kind", f"unknown topology kind {show_value(kind)} (valid: {', '.join(TOPOLOGIES)})")
    model = TOPOLOGIES[kind].keys
    takes = yaml_keys(model)
    for key in data:
        if key == "kind" or key in takes:
            continue
        name = key_text(key)
        if key in ALL_KEYS:
            raise FieldError(name, f"not used by topology kind '{kind}' (it takes: {', '.join(takes)})")
        close = difflib.get_close_matches(name, takes, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise FieldError(name, f"unknown key '{name}' (allowed: kind, {', '.join(takes)}){hint}")
    for name, field in model.model_fields.items():
        if field.is_required() and (field.alias or name) not in data:
            raise FieldError(field.alias or name, f"required for topology kind '{kind}'")
        if _yaml_field(field) is None:  # a plain number (a unit string is bounded by its parser)
            _check_plain_numbers(field.alias or name, data.get(field.alias or name))
    return data


def _check_plain_numbers(key: str, value: Any) -> None:
    """A count or a ratio (leaf_radix, axes, oversubscription, ...): finite and <= MAX_NUMBER, so a
    builder never sees 1e30 or inf (the kind's own model says > 0 and the like)."""
    for number in value if isinstance(value, list) else [value]:
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            continue  # the kind's model says what it expected
        if isinstance(number, float) and not math.isfinite(number):  # (math.isfinite(10**400) raises)
            raise FieldError(key, f"must be a finite number, got {show_value(number)}")
        if abs(number) > MAX_NUMBER:
            raise FieldError(key, f"must be <= {MAX_NUMBER:,}, got {show_value(number)}")


# The type of cluster.topology: one section per kind, chosen by `kind` (to a type checker: any of them).
if TYPE_CHECKING:
    TopologySection = Any
else:
    TopologySection = Annotated[
        Union[tuple(SECTIONS.values())],  # noqa: UP007 (a Union built from the registry)
        Field(discriminator="kind"),
        BeforeValidator(check_keys),
    ]


def drop_kind_tag(loc: tuple) -> tuple:
    """pydantic puts the chosen kind into an error's path (cluster.topology.torus.axes); drop it."""
    return tuple(part for i, part in enumerate(loc) if not (i and loc[i - 1] == "topology" and part in SECTIONS))


def resolved_topology(topology: BaseModel) -> dict[str, Any]:
    """The topology as summary.json shows it: SI values under attribute names, SUMMARY_KEYS first."""
    return {**dict.fromkeys(SUMMARY_KEYS), **topology.model_dump(mode="json")}
