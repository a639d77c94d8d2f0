"""A topology in one short string, for command lines and notebooks, read by the scenario's own models.

    parse_spec("ring:8")                          8 GPUs on a ring
    parse_spec("switch:16")                       16 GPUs on one switch
    parse_spec("torus:4x4x4")                     3D torus (also torus:8x8, torus:16); mesh:4x4 has no wraparound
    parse_spec("dgx:1")                           one DGX H100-style node
    parse_spec("fattree:nodes=8,gpus_per_node=8,oversubscription=2,tiers=3")
    parse_spec("ring:8,link_bandwidth=25GB/s")    any YAML key of the kind, units and all

`kind[:size][,key=value...]`: the size part is the kind's (topologies.kind.SpecForm), the options
are its YAML keys (or their SI attribute names, `link_bandwidth_Bps=1e11`: a bare number is SI only
under a name that says its unit; `link_bandwidth=300` is an error) and the cluster's
`nodes` and `gpus_per_node`; a value reads as a YAML scalar. `keys` given to parse_spec override
the spec's (the CLI's flags); the kind's spec defaults fill what neither gives. Every mistake is a
SpecError naming the spec and the key.
"""

from __future__ import annotations

from typing import Any

import networkx as nx
from pydantic import ValidationError

from clustersim.sim.scenario.errors import FieldError
from clustersim.sim.scenario.loader import parse_yaml_value, translate
from clustersim.sim.scenario.topology import SECTIONS, check_keys
from clustersim.topologies.kind import MAX_GPUS, FitError, Quantity, Shape, TopologyKind
from clustersim.topologies.registry import TOPOLOGIES
from clustersim.topologies.schema import check_schema

SHAPE_KEYS = ("nodes", "gpus_per_node")
SI_UNITS = {"bandwidth": "B/s", "seconds": "s"}  # topologies.kind.Quantity unit -> its SI unit string


class SpecError(ValueError):
    """A bad spec: str is `topology spec '<spec>': [<key>: ]<reason>`; `key` the option to blame, or None."""

    def __init__(self, spec: str, reason: str, key: str | None = None):
        super().__init__(f"topology spec {spec!r}: {f'{key}: ' if key else ''}{reason}")
        self.key = key


def parse_spec(spec: str, **keys: Any) -> nx.DiGraph:
    """The graph a spec names; `keys` (YAML keys, or nodes / gpus_per_node) override the spec's."""
    kind, options = split_spec(spec)
    return build_from_options(spec, kind, {**options, **keys})


def split_spec(spec: str) -> tuple[TopologyKind, dict[str, Any]]:
    """The kind and the options a spec gives (its size part turned into options)."""
    name, _, body = spec.strip().partition(":")
    if name not in TOPOLOGIES:
        raise SpecError(spec, f"unknown kind {name!r} (valid: {', '.join(TOPOLOGIES)})")
    kind = TOPOLOGIES[name]
    items = [item.strip() for item in body.split(",")] if body.strip() else []
    options: dict[str, Any] = {}
    if items and "=" not in items[0]:
        size = items.pop(0)
        if kind.spec.parse_size is None:
            raise SpecError(spec, f"expected key=value, got {size!r}")
        try:
            options.update(kind.spec.parse_size(size))
        except ValueError as exc:
            raise SpecError(spec, f"{name} needs {kind.spec.size} ({exc}), got {size!r}") from None
    elif kind.spec.parse_size is not None:
        raise SpecError(spec, f"{name} needs {kind.spec.size}")
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise SpecError(spec, f"expected key=value, got {item!r}")
        options[key.strip()] = parse_yaml_value(value.strip())
    return kind, options


def build_from_options(spec: str, kind: TopologyKind, options: dict[str, Any]) -> nx.DiGraph:
    """Validate `options` as the kind's scenario section (plus the cluster's shape) and build."""
    names = {name: field.alias for name, field in kind.keys.model_fields.items() if field.alias}
    defaults = {key: _with_si_unit(kind, key, value) for key, value in kind.spec.defaults.items()}
    given = {key: _with_si_unit(kind, key, value) if key in names else value for key, value in options.items()}
    values = {names.get(key, key): value for key, value in {**defaults, **given}.items()}
    nodes, gpus_per_node = values.pop("nodes", 1), values.pop("gpus_per_node", None)
    for key, value in (("nodes", nodes), ("gpus_per_node", gpus_per_node)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise SpecError(spec, f"expected an integer >= 1, got {value!r}", key)
    try:
        keys = SECTIONS[kind.name].model_validate(check_keys({"kind": kind.name, **values}))
    except FieldError as exc:
        raise SpecError(spec, str(exc), ".".join(exc.subpath)) from None
    except ValidationError as exc:
        key, reason = translate(exc.errors()[0])
        raise SpecError(spec, reason, key) from None
    if gpus_per_node is None:
        gpus = kind.gpus(keys)
        if gpus is None or gpus % nodes:
            raise SpecError(spec, f"{kind.name} needs gpus_per_node (or a size, e.g. {kind.name}:8)")
        gpus_per_node = gpus // nodes
    if nodes * gpus_per_node > MAX_GPUS:
        raise SpecError(spec, f"{nodes * gpus_per_node:,} GPUs: more than the {MAX_GPUS:,} a fabric may have")
    try:
        shape = Shape(nodes, gpus_per_node)
        kind.fits(keys, shape)
        graph = kind.build(keys, shape)
        check_schema(graph)  # e.g. a value a builder does not check
    except FitError as exc:
        raise SpecError(spec, str(exc), exc.key.removeprefix("topology.")) from None
    except (TypeError, ValueError) as exc:
        raise SpecError(spec, str(exc)) from None
    return graph


def _with_si_unit(kind: TopologyKind, key: str, value: Any) -> Any:
    """A bare number under an SI attribute name (`link_bandwidth_Bps=1e11`, whose name says the
    unit), or a kind's SI default, as a unit string the YAML key's parser reads ('1e+11B/s')."""
    fields = {name: field for name, field in kind.keys.model_fields.items()}
    fields.update({field.alias: field for field in kind.keys.model_fields.values() if field.alias})
    quantity = next((m for m in fields[key].metadata if isinstance(m, Quantity)), None) if key in fields else None
    if quantity is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return f"{float(value)!r}{SI_UNITS[quantity.unit]}"


def key_flags() -> dict[str, str]:
    """Every kind's YAML keys with a help text naming the kinds that take them, for the CLI's flags."""
    helps: dict[str, tuple[str, list[str]]] = {}
    for kind in TOPOLOGIES.values():
        for name, field in kind.keys.model_fields.items():
            key = field.alias or name
            description, kinds = helps.setdefault(key, (field.description or "", []))
            kinds.append(kind.name)
    return {key: f"{description} ({', '.join(kinds)})" for key, (description, kinds) in helps.items()}
