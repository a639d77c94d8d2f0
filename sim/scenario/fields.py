"""Field types of the scenario format: unit strings parsed to SI floats, names checked against a
registry (a miss lists the valid names), and the strict, frozen base of every section."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from clustersim.sim.scenario import units
from clustersim.sim.scenario.errors import show_value


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def one_of(valid: tuple[str, ...] | dict, what: str) -> Any:
    """A str that must be one of `valid` (a registry dict or a tuple); a miss lists them all."""

    def check(value: str) -> str:
        if value not in valid:
            raise ValueError(f"unknown {what} '{value}' (valid: {', '.join(valid)})")
        return value

    return Annotated[str, AfterValidator(check), Field(json_schema_extra={"enum": list(valid)})]


def unit(
    parse: Callable[[object], float],
    pattern: str,
    example: str,
    si: str,
    *,
    zero_ok: bool,
    bounds: tuple[float, float, str, str],
    bare_number: bool = False,
) -> Any:
    """A float field written as a unit string, parsed at validation (`bare_number`: the parser
    takes a plain number as SI; else it demands a unit). It must be > 0
    (>= 0 if zero_ok), finite, and within `bounds` (low, high, and each as written, e.g. '1PB/s');
    the checks are here so the message quotes what was written."""
    low, high, low_text, high_text = bounds

    def parse_checked(value: object) -> float:
        number = parse(value)  # finite, or +-inf from a text such as '1e400GB/s' (the parser refuses nan)
        if number < 0 or (number == 0 and not zero_ok):
            raise ValueError(f"must be {'>=' if zero_ok else '>'} 0, got {show_value(value)}")
        if not number <= high:
            raise ValueError(f"must be <= {high_text}, got {show_value(value)}")
        if number < low and not (zero_ok and number == 0):
            raise ValueError(f"must be >= {low_text}, got {show_value(value)}")
        return number

    sign = ">=" if zero_ok else ">"
    schema: dict[str, Any] = {
        "anyOf": [{"type": "string", "pattern": pattern, "examples": [example]}],
        "description": f"e.g. '{example}', with its unit; {sign} 0, <= {high_text}",
    }
    if bare_number:
        schema["anyOf"].append({"type": "number"})
        schema["description"] = f"e.g. '{example}', or a plain number in {si}; {sign} 0, <= {high_text}"
    elif zero_ok:
        schema["anyOf"].append({"const": 0})
    return Annotated[float, BeforeValidator(parse_checked), WithJsonSchema(schema)]


Bytes = unit(
    units.parse_bytes,
    units.BYTES_PATTERN,
    "80GiB",
    "bytes",
    zero_ok=False,
    bounds=(1, 2.0**50, "1B", "1PiB"),
    bare_number=True,
)
Bandwidth = unit(
    units.parse_bandwidth,
    units.BANDWIDTH_PATTERN,
    "300GB/s",
    "bytes/s",
    zero_ok=False,
    bounds=(1, 1e15, "1B/s", "1PB/s"),
)
Seconds = unit(units.parse_seconds, units.TIME_PATTERN, "1.5us", "seconds", zero_ok=True, bounds=(0, 10, "0s", "10s"))
Flops = unit(
    units.parse_flops,
    units.FLOPS_PATTERN,
    "312TFLOPS",
    "FLOP/s",
    zero_ok=False,
    bounds=(1e6, 1e18, "1MFLOPS", "1EFLOPS"),
    bare_number=True,
)


def finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {show_value(value)}")
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


UNITS = {"bandwidth": Bandwidth, "seconds": Seconds}  # topologies.kind.Quantity unit -> field type
