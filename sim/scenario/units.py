"""Unit strings in, SI floats out: parsed once, at the edge (the scenario loader).

Inside clustersim every quantity is SI: bytes, bytes/s, seconds, FLOP/s. Users write
"80GiB", "300GB/s", "25Gb/s", "1.5us", "312TFLOPS"; these functions turn them into floats.

Prefixes: decimal k/K M G T P (E for FLOP/s) = 10^3, 10^6, ...; binary Ki Mi Gi Ti Pi =
2^10, 2^20, ... Case matters for the base unit: "B" is a byte, "b" is a bit (bits / 8 = bytes),
so "25Gb/s" = 25e9 / 8 = 3.125e9 bytes/s. A plain number (int, float, or a string such as
"4096") is taken as already SI for a size or a compute rate; a bandwidth or a time must carry its
unit ("300" alone is an error, not 300 bytes/s; only a time of 0 needs none). Every parser raises
ValueError with the text (cut to a few dozen characters) and an example of what it expected.
"""

from __future__ import annotations

import math
import re

from clustersim.sim.scenario.errors import show_value

_NUMBER = r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_BYTE_PREFIXES = {**{k: v for k, v in _DECIMAL.items() if k != "E"}, **_BINARY}
_BITS_PER_BYTE = 8.0
# Divisors, not multipliers: 500 / 1e9 is exactly the double nearest 5e-7; 500 * 1e-9 is not.
_PER_SECOND = {"s": 1.0, "ms": 1e3, "us": 1e6, "\u00b5s": 1e6, "\u03bcs": 1e6, "ns": 1e9, "ps": 1e12}

_PREFIX = r"(?P<prefix>Ki|Mi|Gi|Ti|Pi|[kKMGTP]?)"
_BYTES_RE = re.compile(rf"^{_NUMBER}\s*{_PREFIX}(?P<base>[Bb]?)$")
_BANDWIDTH_RE = re.compile(rf"^{_NUMBER}\s*{_PREFIX}(?P<base>[Bb])(?:/s|ps)$")
_TIME_RE = re.compile(rf"^{_NUMBER}\s*(?P<unit>s|ms|us|\u00b5s|\u03bcs|ns|ps)$|^[+-]?0+(?:\.0*)?$")
_PLAIN_NUMBER_RE = re.compile(rf"^{_NUMBER}$")
_FLOPS_RE = re.compile(rf"^{_NUMBER}\s*(?:(?P<prefix>[kKMGTPE]?)(?:FLOPS|FLOP/s|flops|flop/s))?$")


def _schema_pattern(regex: re.Pattern) -> str:
    """The regex without Python's named groups, for JSON schema (ECMA-262) consumers."""
    return re.sub(r"\?P<\w+>", "", regex.pattern)


# Patterns for the JSON schema (editors highlight bad values before the loader sees them).
BYTES_PATTERN = _schema_pattern(_BYTES_RE)
BANDWIDTH_PATTERN = _schema_pattern(_BANDWIDTH_RE)
TIME_PATTERN = _schema_pattern(_TIME_RE)
FLOPS_PATTERN = _schema_pattern(_FLOPS_RE)


def _plain_number(value: object, kind: str, example: str) -> float | None:
    """An int/float (not bool) is already SI; anything else that is not a str is an error."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{show_value(value)} is not {kind}; expected e.g. '{example}'")
    if isinstance(value, str):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"{show_value(value)} is not {kind}: it must be finite")
    return number


def _fail(text: str, kind: str, example: str, hint: str = "") -> ValueError:
    return ValueError(f"{show_value(text)} is not {kind}; expected e.g. '{example}'{hint}")


def _needs_unit(value: object, units: str, examples: tuple[str, str]) -> None:
    """A bandwidth or a time written as a bare number (300, '300'): which unit was meant is a guess."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)) or (isinstance(value, str) and _PLAIN_NUMBER_RE.match(value.strip())):
        shown = show_value(value).strip("'")
        first, second = (f"'{shown}{unit}'" for unit in examples)
        raise ValueError(f"{show_value(value)} has no unit: add one ({units}), e.g. {first} or {second}")


def parse_bytes(value: object) -> float:
    """'80GiB' -> 85899345920.0, '1.5MB' -> 1.5e6, '4096' -> 4096.0, 4096 -> 4096.0.

    A size written in bits ('8Gb') is rejected: memory is sized in bytes, and a lowercase 'b'
    there is almost always a typo for 'B'.
    """
    kind, example = "a size in bytes", "80GiB"
    number = _plain_number(value, kind, example)
    if number is not None:
        return number
    text = str(value).strip()
    match = _BYTES_RE.match(text)
    if match is None:
        raise _fail(str(value), kind, example)
    if match["base"] == "b":
        raise _fail(str(value), kind, example, " ('b' means bits; write 'B' for bytes)")
    return float(match["num"]) * _BYTE_PREFIXES[match["prefix"] or ""]


def parse_bandwidth(value: object) -> float:
    """Bytes/s: '300GB/s' -> 3e11, '25Gb/s' -> 3.125e9 (bits / 8), '100GiB/s', '400Gbps'."""
    kind, example = "a bandwidth", "300GB/s"
    _plain_number(value, kind, example)  # a list, a bool, inf: not a bandwidth at all
    _needs_unit(value, "B/s, kB/s, MB/s, GB/s, TB/s, or b/s ... Tb/s for bits", ("GB/s", "B/s"))
    match = _BANDWIDTH_RE.match(str(value).strip())
    if match is None:
        raise _fail(str(value), kind, example)
    scale = _BYTE_PREFIXES[match["prefix"] or ""]
    if match["base"] == "b":
        scale /= _BITS_PER_BYTE  # bits/s -> bytes/s
    return float(match["num"]) * scale


def parse_seconds(value: object) -> float:
    """'2us' -> 2e-6, '500ns' -> 5e-7, '3ms' -> 3e-3, '1s' -> 1.0, '2µs' -> 2e-6, 0 -> 0.0 (zero
    alone needs no unit; any other bare number is an error)."""
    kind, example = "a time", "1.5us"
    if _plain_number(value, kind, example) == 0.0:
        return 0.0
    match = _TIME_RE.match(str(value).strip())
    if match is not None and match["num"] is None:  # '0', '0.0'
        return 0.0
    _needs_unit(value, "s, ms, us, ns, ps", ("us", "s"))
    if match is None:
        raise _fail(str(value), kind, example)
    return float(match["num"]) / _PER_SECOND[match["unit"]]


def parse_flops(value: object) -> float:
    """FLOP per second: '312TFLOPS' -> 3.12e14, '989.5TFLOP/s' -> 9.895e14."""
    kind, example = "a compute rate", "312TFLOPS"
    number = _plain_number(value, kind, example)
    if number is not None:
        return number
    match = _FLOPS_RE.match(str(value).strip())
    if match is None:
        raise _fail(str(value), kind, example)
    return float(match["num"]) * _DECIMAL[match["prefix"] or ""]


def _scaled(value: float, steps: list[tuple[float, str]], unit: str) -> str:
    """Pick the largest step not above |value|, print 3 significant digits."""
    scale, prefix = next(((s, p) for s, p in steps if abs(value) >= s), steps[-1])
    scaled = value / scale
    text = f"{scaled:.0f}" if abs(scaled) >= 1000 else f"{scaled:.3g}"
    return f"{text} {prefix}{unit}"


def format_bytes(nbytes: float) -> str:
    """Binary prefixes, as memory is sized: 85899345920 -> '80 GiB', 1536 -> '1.5 KiB'."""
    steps = [(2.0**40, "Ti"), (2.0**30, "Gi"), (2.0**20, "Mi"), (2.0**10, "Ki"), (1.0, "")]
    return _scaled(nbytes, steps, "B")
