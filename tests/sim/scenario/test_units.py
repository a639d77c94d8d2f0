"""sim.units: unit strings -> SI floats, once, at the edge; and the human-readable formatters."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clustersim.sim.scenario.units import format_bytes, parse_bandwidth, parse_bytes, parse_flops, parse_seconds


@pytest.mark.parametrize(
    "text, expected",
    [
        ("80GiB", 80 * 2**30),
        ("1.5MB", 1.5e6),
        ("4096", 4096),
        ("4KiB", 4096),
        ("4kB", 4000),
        ("2TiB", 2 * 2**40),
        ("512B", 512),
        ("80 GB", 80e9),
        ("80G", 80e9),
        (4096, 4096),
        (1.5e9, 1.5e9),
    ],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("300GB/s", 300e9),
        ("25Gb/s", 25e9 / 8),  # lowercase b = bits
        ("1.6Tb/s", 1.6e12 / 8),
        ("100GiB/s", 100 * 2**30),
        ("400Gbps", 400e9 / 8),
        ("50 GB/s", 50e9),
        ("3e11B/s", 3e11),
    ],
)
def test_parse_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected, rel=1e-15)


def test_bits_are_one_eighth_of_bytes():
    assert parse_bandwidth("200Gb/s") * 8 == parse_bandwidth("200GB/s")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2us", 2e-6),
        ("1.5us", 1.5e-6),
        ("500ns", 5e-7),
        ("3ms", 3e-3),
        ("1s", 1.0),
        ("2\u00b5s", 2e-6),  # micro sign
        ("2\u03bcs", 2e-6),  # greek mu
        ("0", 0.0),  # zero alone needs no unit
        (0, 0.0),
        ("1e-6s", 1e-6),
    ],
)
def test_parse_seconds(text, expected):
    assert parse_seconds(text) == expected  # exact: divisors, not multipliers


@pytest.mark.parametrize(
    "text, expected", [("312TFLOPS", 312e12), ("989.5TFLOP/s", 989.5e12), ("1PFLOPS", 1e15), ("2.5e14", 2.5e14)]
)
def test_parse_flops(text, expected):
    assert parse_flops(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize(
    "parse, text, message",
    [
        (parse_bandwidth, "3 parsecs", r"^'3 parsecs' is not a bandwidth; expected e\.g\. '300GB/s'$"),
        (parse_bandwidth, "300GB", r"is not a bandwidth"),  # a size, not a rate
        (parse_bytes, "8Gb", r"'b' means bits; write 'B' for bytes"),
        (parse_bytes, "lots", r"^'lots' is not a size in bytes; expected e\.g\. '80GiB'$"),
        (parse_seconds, "2 fortnights", r"is not a time; expected e\.g\. '1\.5us'"),
        (parse_flops, "312TB/s", r"is not a compute rate; expected e\.g\. '312TFLOPS'"),
        (parse_bytes, True, r"^true is not a size in bytes"),  # a YAML bool is not a number
        # a bandwidth or a time needs its unit: '300' is not silently 300 bytes/s
        (parse_bandwidth, 300, r"^300 has no unit: add one \(B/s, .*\), e\.g\. '300GB/s' or '300B/s'$"),
        (parse_bandwidth, "300", r"^'300' has no unit: add one"),
        (parse_bandwidth, 3e11, r"^300000000000\.0 has no unit"),
        (parse_seconds, 1e-6, r"^1e-06 has no unit: add one \(s, ms, us, ns, ps\), e\.g\. '1e-06us' or '1e-06s'$"),
        (parse_seconds, "5", r"^'5' has no unit"),
        # a value in an error is cut short, never printed whole
        (parse_bandwidth, "9" * 10_000 + "x", r"^'9{70,80}\.\.\. is not a bandwidth; expected e\.g\. '300GB/s'$"),
        (parse_bandwidth, [[1] * 1000] * 1000, r"^a list is not a bandwidth"),
        (parse_seconds, [1], r"is not a time"),
        (parse_bytes, math.inf, r"must be finite"),
        (parse_bytes, "", r"is not a size in bytes"),
    ],
)
def test_rejects_bad_unit_strings(parse, text, message):
    with pytest.raises(ValueError, match=message):
        parse(text)


@given(st.integers(min_value=0, max_value=10**6))
def test_binary_prefixes_are_powers_of_two(n):
    assert parse_bytes(f"{n}KiB") == n * 1024
    assert parse_bytes(f"{n}MiB") == n * 2**20


@given(st.floats(min_value=1e-3, max_value=1e6, allow_nan=False))
def test_units_scale_consistently(x):
    assert parse_seconds(f"{x!r}ms") == pytest.approx(parse_seconds(f"{x!r}us") * 1000)
    assert parse_bandwidth(f"{x!r}Gb/s") == pytest.approx(parse_bandwidth(f"{x!r}GB/s") / 8)


@pytest.mark.parametrize(
    "fmt, value, expected",
    [(format_bytes, 80 * 2**30, "80 GiB"), (format_bytes, 1536, "1.5 KiB"), (format_bytes, 3, "3 B")],
)
def test_formatters_are_human_readable(fmt, value, expected):
    assert fmt(value) == expected
