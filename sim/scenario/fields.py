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


def unit(parse: Callable[[object], float], pattern: str, example: str, si: str, zero_ok: bool) -> Any:
    """A float field written as a unit string (or a plain SI number), parsed at validation.
    It must be > 0 (>= 0 if zero_ok); the check is here so the message quotes what was written."""

    def parse_checked(value: object) -> float:
        number = parse(value)
        if number < 0 or (number == 0 and not zero_ok):
            raise ValueError(f"must be {'>=' if zero_ok else '>'} 0, got {show_value(value)}")
        return number

    schema = {
        "anyOf": [{"type": "string", "pattern": pattern, "examples": [example]}, {"type": "number"}],
        "description": f"e.g. '{example}', or a plain number in {si}; {'>=' if zero_ok else '>'} 0",
    }
    return Annotated[float, BeforeValidator(parse_checked), WithJsonSchema(schema)]


Bytes = unit(units.parse_bytes, units.BYTES_PATTERN, "80GiB", "bytes", False)
Bandwidth = unit(units.parse_bandwidth, units.BANDWIDTH_PATTERN, "300GB/s", "bytes/s", False)
Seconds = unit(units.parse_seconds, units.TIME_PATTERN, "1.5us", "seconds", zero_ok=True)
Flops = unit(units.parse_flops, units.FLOPS_PATTERN, "312TFLOPS", "FLOP/s", False)


def finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {show_value(value)}")
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


UNITS = {"bandwidth": Bandwidth, "seconds": Seconds}  # topologies.kind.Quantity unit -> field type
