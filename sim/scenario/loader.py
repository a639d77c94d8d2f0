"""Reading a scenario: YAML text -> `Scenario`, and pydantic's errors -> one `ScenarioError` line.

    scenario = load_scenario("scenarios/quickstart.yaml")

The models and their rules live in sim.scenario.schema; this module only reads files, parses YAML
strictly (duplicate keys are errors; '1e-3' is a float) and words the first error for a person.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from clustersim.sim.scenario.errors import FieldError, ScenarioError, show_value
from clustersim.sim.scenario.presets import MODELS
from clustersim.sim.scenario.schema import Scenario
from clustersim.sim.scenario.topology import drop_kind_tag


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys and reads YAML 1.2 floats ('1e-3' is a float)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key '{key}'", key_node.start_mark)
            seen.add(key if isinstance(key, str) else id(key_node))
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|\.(?:inf|Inf|INF))$|^\.(?:nan|NaN|NAN)$"
    ),
    list("-+0123456789."),
)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file. Any problem is a one-line ScenarioError."""
    return load_scenario_text(_read(path), str(path))


def load_scenarios(path: str | Path) -> list[Scenario]:
    """A scenario file's variants (see `load_variants_text`), or the one scenario it holds."""
    return load_variants_text(_read(path), str(path))


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(path, "-", "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise ScenarioError(path, "-", f"cannot read: {reason}") from None


def load_scenario_text(text: str, filename: str = "<string>") -> Scenario:
    """Validate scenario YAML given as text; `filename` is only used in error messages."""
    data = _parse(text, filename)
    if "variants" in data:
        raise ScenarioError(
            filename, "variants", "this file defines variants of a scenario: run them with `clustersim compare`"
        )
    return _validate(data, filename)


def load_variants_text(text: str, filename: str = "<string>") -> list[Scenario]:
    """The scenarios of a file with `variants:`, a list of {name, and dotted-path overrides}:

        variants:
          - {name: torus, cluster.topology: {kind: torus, axes: [4, 4, 4]}}
          - {name: fattree, cluster.topology: {kind: fattree}}

    Each variant is the file without `variants`, each override replacing the value at its path,
    named "<name>-<variant name>". A file without variants gives its one scenario."""
    data = _parse(text, filename)
    variants = data.pop("variants", None)
    if variants is None:
        return [_validate(data, filename)]
    if not isinstance(variants, list) or len(variants) < 1:
        raise ScenarioError(filename, "variants", f"expected a list of variants, got {show_value(variants)}")
    scenarios = []
    for i, variant in enumerate(variants):
        where = f"variants[{i}]"
        if not isinstance(variant, dict) or not isinstance(variant.get("name"), str):
            raise ScenarioError(filename, where, "each variant is a mapping with a name and dotted-path overrides")
        copy = yaml.load(yaml.safe_dump(data), Loader=_StrictLoader)  # noqa: S506 (a deep copy)
        for dotted, value in variant.items():
            if dotted == "name":
                continue
            *parents, leaf = str(dotted).split(".")
            node = copy
            for key in parents:
                if not isinstance(node.get(key, {}), dict):
                    raise ScenarioError(filename, f"{where}.{dotted}", f"'{key}' is not a section")
                node = node.setdefault(key, {})
            node[leaf] = value
        copy["name"] = f"{data.get('name', 'scenario')}-{variant['name']}"
        scenarios.append(_validate(copy, f"{filename} ({where}: {variant['name']})"))
    return scenarios


def parse_yaml_value(text: str) -> Any:
    """One value as a scenario file reads it ("8" -> 8, "1e-3" -> 0.001, "[4, 4]" -> a list; a
    unit string such as "100GB/s" stays a string), for command-line options; bad YAML stays text."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError:
        return text


def _parse(text: str, filename: str) -> dict:
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        raise ScenarioError(filename, "-", _yaml_reason(exc)) from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else show_value(data)
        sections = ", ".join(_keys(Scenario))
        reason = f"top level must be a mapping with keys {sections}; got {got}"
        raise ScenarioError(filename, "-", reason)
    return data


def _validate(data: dict, filename: str) -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        # An unknown key is usually the cause of a "missing" one (a typo), so it goes first.
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        path, reason = translate(first)
        raise ScenarioError(filename, path, reason) from None


def _yaml_reason(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return f"invalid YAML: {problem}"
    return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"


def _keys(model: type[BaseModel]) -> list[str]:
    """The YAML keys a section accepts (aliases where the attribute name carries a unit)."""
    return [field.alias or name for name, field in model.model_fields.items()]


def _section_at(loc: tuple) -> type[BaseModel] | None:
    """The section model a YAML path points into, walking from Scenario."""
    model: Any = Scenario
    for key in loc:
        fields = {field.alias or name: field for name, field in model.model_fields.items()}
        model = fields[key].annotation if key in fields else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
    return model


_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dict_type": "a mapping",
}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def translate(error: ErrorDetails) -> tuple[str, str]:
    """One pydantic error -> (dotted YAML path, short reason)."""
    loc, kind, ctx = drop_kind_tag(tuple(error["loc"])), error["type"], error.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, FieldError):
        loc = loc + cause.subpath
    path = ".".join(str(part) for part in loc) or "-"
    if kind == "extra_forbidden":
        section = _section_at(loc[:-1])
        keys = _keys(section) if section else []
        allowed = f" (allowed: {', '.join(keys)})" if keys else ""
        close = difflib.get_close_matches(str(loc[-1]), keys, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return path, f"unknown key '{loc[-1]}'{allowed}{hint}"
    if kind == "invalid_key":
        return path, f"keys must be strings, got {show_value(loc[-1])}"
    if kind == "missing":
        in_model = len(loc) == 2 and loc[0] == "model"
        hint = f" (or set model.preset: {', '.join(MODELS)})" if in_model else ""
        return path, f"required field missing{hint}"
    if kind in _EXPECTED:
        return path, f"expected {_EXPECTED[kind]}, got {show_value(error['input'])}"
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()))
        return path, f"must be {_BOUNDS[kind]} {bound:g}, got {show_value(error['input'])}"
    if kind == "value_error" and cause is not None:
        return path, str(cause)
    return path, error["msg"]
