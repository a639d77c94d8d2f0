"""Reading a scenario: YAML text -> `Scenario`, and pydantic's errors -> one `ScenarioError` line.

    scenario = load_scenario("scenarios/quickstart.yaml")

The models and their rules live in sim.scenario.schema; this module only reads files, parses YAML
strictly and within bounds (sim.scenario.strict_yaml: duplicate keys are errors, '1e-3' is a float;
nesting depth, alias-expanded size and text length are limited) and words the first error for a person.
"""

from __future__ import annotations

import difflib
import re
from copy import deepcopy
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from clustersim.sim.scenario.errors import FieldError, ScenarioError, clip, key_text, show_value
from clustersim.sim.scenario.presets import MODELS
from clustersim.sim.scenario.schema import Scenario
from clustersim.sim.scenario.strict_yaml import MAX_TEXT_CHARS, StrictLoader
from clustersim.sim.scenario.topology import drop_kind_tag


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file. Any problem is a one-line ScenarioError."""
    return load_scenario_text(_read(path), str(path))


def load_scenarios(path: str | Path) -> list[Scenario]:
    """A scenario file's variants (see `load_variants_text`), or the one scenario it holds."""
    return load_variants_text(_read(path), str(path))


def _read(path: str | Path) -> str:
    try:
        with open(path, encoding="utf-8") as file:  # noqa: PTH123 (a bounded read)
            return file.read(MAX_TEXT_CHARS + 1)  # _parse refuses what is longer
    except FileNotFoundError:
        raise ScenarioError(path, "-", "no such file") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # ValueError: a NUL byte in the path
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
        overrides = {dotted: value for dotted, value in variant.items() if dotted != "name"}
        copy = with_overrides(data, overrides, filename, where)
        base = data.get("name", "scenario")
        copy["name"] = f"{base}-{variant['name']}" if isinstance(base, str) else base  # a bad name: reported
        scenarios.append(_validate(copy, f"{filename} ({where}: {clip(variant['name'])})"))
    return scenarios


def with_overrides(data: dict, overrides: dict[str, Any], filename: str, where: str = "") -> dict:
    """A deep copy of scenario data with each dotted-path override ("parallel.tp": 4) replacing the
    value at its path (a missing section is made); a path through a value that is not a section is
    a ScenarioError naming `where` (the place the override was written) and the path. Validating
    the result (`validate_data`) reports any other bad key or value."""
    copy = deepcopy(data)
    for dotted, value in overrides.items():
        *parents, leaf = key_text(dotted).split(".")
        node = copy
        for key in parents:
            if not isinstance(node.get(key, {}), dict):
                raise ScenarioError(filename, f"{where}.{dotted}" if where else dotted, f"'{key}' is not a section")
            node = node.setdefault(key, {})
        node[leaf] = value
    return copy


def scenario_data(path: str | Path) -> dict:
    """A scenario file's YAML as data, read and parsed as `load_scenario` does but not validated
    (for tools that derive scenarios from it: `with_overrides`, then `validate_data`)."""
    return _parse(_read(path), str(path))


def validate_data(data: dict, filename: str) -> Scenario:
    """Scenario data (a parsed file, maybe with overrides) validated as a file is; any problem is
    a one-line ScenarioError naming `filename`."""
    return _validate(data, filename)


def parse_yaml_value(text: str) -> Any:
    """One value as a scenario file reads it ("8" -> 8, "1e-3" -> 0.001, "[4, 4]" -> a list; a
    unit string such as "100GB/s" stays a string), for command-line options; bad YAML stays text."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError:
        return text


def _parse(text: str, filename: str) -> dict:
    if len(text) > MAX_TEXT_CHARS:
        reason = f"more than {MAX_TEXT_CHARS:,} characters; a scenario is a page or two of YAML"
        raise ScenarioError(filename, "-", reason)
    try:
        data = yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        raise ScenarioError(filename, "-", _yaml_reason(exc)) from None
    except (ValueError, OverflowError) as exc:  # PyYAML building a scalar: a date 2024-13-45, a 5,000-digit int
        raise ScenarioError(filename, "-", f"invalid YAML: a value cannot be read: {clip(str(exc))}") from None
    _check_strings(data, filename, ())
    if not isinstance(data, dict):
        got = "an empty file" if data is None else show_value(data)
        sections = ", ".join(_keys(Scenario))
        reason = f"top level must be a mapping with keys {sections}; got {got}"
        raise ScenarioError(filename, "-", reason)
    return data


_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_strings(value: Any, filename: str, path: tuple) -> None:
    """No string (key or value) holds a lone surrogate: YAML's "\\ud800" escape reads as one, and
    it is not text (pydantic, JSON and the file system all refuse it)."""
    if isinstance(value, str) and _SURROGATE.search(value):
        where = ".".join(key_text(part) for part in path) or "-"
        raise ScenarioError(filename, where, f"{show_value(value)} holds a lone surrogate, which is not text")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_strings(key, filename, path)
            _check_strings(item, filename, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_strings(item, filename, (*path, i))


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
    path = ".".join(key_text(part) for part in loc) or "-"
    if kind == "extra_forbidden":
        section = _section_at(loc[:-1])
        keys = _keys(section) if section else []
        allowed = f" (allowed: {', '.join(keys)})" if keys else ""
        close = difflib.get_close_matches(key_text(loc[-1]), keys, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return path, f"unknown key '{key_text(loc[-1])}'{allowed}{hint}"
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
        shown = f"{bound:,}" if isinstance(bound, int) else f"{bound:g}"
        return path, f"must be {_BOUNDS[kind]} {shown}, got {show_value(error['input'])}"
    if kind == "string_too_long":
        return path, f"at most {ctx['max_length']:,} characters, got {len(error['input']):,}"
    if kind == "finite_number":
        return path, f"must be a finite number, got {show_value(error['input'])}"
    if kind == "value_error" and cause is not None:
        return path, str(cause)
    return path, error["msg"]
