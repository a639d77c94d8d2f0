"""Fuzzing the loader (issue 16, acceptance 2): the bundled scenarios, mutated (values replaced by
random types, huge, negative, infinite or NaN numbers, long strings, nested structures and alias
bombs; keys deleted and added; raw YAML tokens spliced into the text), each end in a Scenario or a
one-line ScenarioError: never another exception, within a time budget per case, and a scenario that
loads resolves to valid JSON (no Infinity or NaN for summary.json). Load only: nothing is simulated.

The default run tries 2,500 cases (about 15 s); the `slow` one 4,000 more."""

from __future__ import annotations

import json
import math
import resource
import time
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clustersim.sim.scenario.loader import load_variants_text
from clustersim.sim.scenario.schema import ScenarioError

from repo import SCENARIOS

BUNDLED = {path.relative_to(SCENARIOS).as_posix(): path.read_text() for path in sorted(SCENARIOS.glob("**/*.yaml"))}
CASE_BUDGET_S = 5.0  # per case; a real load takes milliseconds (generous for a loaded CI machine)
MEMORY_BUDGET_KB = 512 * 1024  # growth of the process's peak RSS over a whole test


def _keys(node: Any) -> set[str]:
    if isinstance(node, dict):
        return {str(k) for k in node} | {key for value in node.values() for key in _keys(value)}
    if isinstance(node, list):
        return {key for item in node for key in _keys(item)}
    return set()


KNOWN_KEYS = sorted(set().union(*(_keys(yaml.safe_load(text)) for text in BUNDLED.values())))
WORDS = [
    "switch",
    "fattree",
    "torus",
    "dgx",
    "dragonfly",
    "ring",
    "mesh",
    "1f1b",
    "gpipe",
    "interleaved",
    "gpt3-1.3b",
    "mixtral-8x7b",
    "tiny-8l",
    "A100-SXM-80GB",
    "H100-SXM",
    "adam",
    "sgd",
    "bf16",
    "selective",
    "full",
    "adaptive",
    "ecmp",
    "valiant",
]
UNIT_TEXTS = [
    "300",
    "300GB/s",
    "25Gb/s",
    "1e300GB/s",
    "1e400GB/s",
    "1e-300GB/s",
    "-1GB/s",
    "0GB/s",
    "infGB/s",
    "nanGB/s",
    "1us",
    "-1us",
    "1e300s",
    "0",
    "80GiB",
    "1e30PiB",
    "0B",
    "1B",
    "312TFLOPS",
    "1e300TFLOPS",
    "1e-300FLOPS",
    "",
    " ",
    "\x00",
    "a\x00b",
    "\u00b5s",
    "1\u00b5s",
]
NUMBERS = st.sampled_from(
    [0, 1, -1, 2, 3, 4, 7, 8, 16, 64, 2**31, 2**40 + 1, 2**63, 2**64, 10**30, -(10**30), 10**4000, 51200]
) | st.sampled_from([math.inf, -math.inf, math.nan, 1e300, -1e300, 5e-324, -0.0, 0.5, 1.5, 1e-3])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    NUMBERS,
    st.floats(),
    st.text(max_size=20),
    st.text(min_size=200, max_size=400),
    st.sampled_from(UNIT_TEXTS + WORDS),
)
KEYS = st.sampled_from(KNOWN_KEYS) | st.text(max_size=12) | st.integers(-5, 5)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4), max_leaves=10
)


def _paths(root: Any) -> list[tuple]:
    """Paths (keys and list indices) to values inside `root`, breadth first, at most 400 of them,
    each shared container entered once (a mutated document may hold aliases, cycles, bombs)."""
    found: list[tuple] = []
    queue, seen = [((), root)], {id(root)}
    while queue and len(found) < 400:
        prefix, node = queue.pop(0)
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            found.append((*prefix, key))
            if isinstance(value, (dict, list)) and id(value) not in seen and len(prefix) < 12:
                seen.add(id(value))
                queue.append(((*prefix, key), value))
    return found


def _at(root: Any, path: tuple) -> Any:
    for key in path:
        root = root[key]
    return root


def _bomb(width: int, depth: int) -> list:
    """A list of width^depth strings in depth shared levels: safe_dump writes it with aliases."""
    level: list = ["lol"] * width
    for _ in range(depth - 1):
        level = [level] * width
    return level


def _nested(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


@st.composite
def mutated_documents(draw: st.DrawFn) -> str:
    """A bundled scenario with 1 to 4 mutations, dumped back to YAML (shared objects as aliases)."""
    data = yaml.safe_load(BUNDLED[draw(st.sampled_from(sorted(BUNDLED)))])
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(data)
        kind = draw(st.sampled_from(["replace", "replace", "delete", "add", "alias", "bomb", "deep"]))
        if not paths or kind == "add":
            containers = [()] + [p for p in paths if isinstance(_at(data, p), dict)]
            _at(data, draw(st.sampled_from(containers)))[draw(KEYS)] = draw(VALUES)
            continue
        path = draw(st.sampled_from(paths))
        parent, key = _at(data, path[:-1]), path[-1]
        if kind == "delete":
            del parent[key]
        elif kind == "replace":
            parent[key] = draw(VALUES)
        elif kind == "alias":  # the same object at two places, or inside itself
            parent[key] = _at(data, draw(st.sampled_from(paths))[: draw(st.integers(0, 3)) or None])
        elif kind == "bomb":
            parent[key] = _bomb(draw(st.integers(2, 10)), draw(st.integers(1, 9)))
        else:
            parent[key] = _nested(draw(st.integers(1, 300)))
    try:
        return yaml.safe_dump(data, sort_keys=draw(st.booleans()), allow_unicode=draw(st.booleans()))
    except RecursionError:  # PyYAML's emitter on a deep enough value: the raw-text test covers those
        return "name: " + "[" * 1000 + "]" * 1000


RAW_TOKENS = [
    ".inf",
    "-.inf",
    ".nan",
    "1e400",
    "-1e400",
    "9" * 5000,
    "-" + "9" * 100,
    "0x7FFFFFFFFFFFFFFFFFFF",
    "0o777",
    "1_000_000",
    "2024-13-45",
    "2024-01-01",
    "!!binary AAAA",
    "!!binary ?",
    "!!python/object:os.system",
    "!!float abc",
    "!!int 1.5",
    "!!set {a, b}",
    "!!omap [a: 1]",
    "&a [*a]",
    "*undefined",
    "&x 1",
    "[" * 200,
    "[" * 200 + "]" * 200,
    "{" * 100,
    "{a: 1, a: 2}",
    "'\\0'",
    '"\\0"',
    '"\\ud800"',
    "~",
    "|\n  text",
    ">",
    "? [a]\n: b",
    "{[1]: 2}",
    "- a",
    "\t",
    "'" + "x" * 5000 + "'",
    "300",
    "1e-6",
    "yes",
    "<<: *a",
    "%YAML 1.1",
    "---",
    "...",
    "@",
    "`",
]


@st.composite
def spliced_texts(draw: st.DrawFn) -> str:
    """A bundled scenario's text with a raw YAML token spliced over a value, a line's end, or
    anywhere; or cut short."""
    lines = BUNDLED[draw(st.sampled_from(sorted(BUNDLED)))].splitlines()
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        token = draw(st.sampled_from(RAW_TOKENS) | st.text(max_size=10))
        line = lines[i]
        how = draw(st.sampled_from(["value", "append", "insert", "cut"]))
        if how == "value" and ":" in line:
            lines[i] = line[: line.index(":") + 1] + " " + token
        elif how == "append":
            lines[i] = line + token
        elif how == "insert":
            at = draw(st.integers(0, len(line)))
            lines[i] = line[:at] + token + line[at:]
        else:
            lines = lines[: i + 1]
            lines[-1] = line[: draw(st.integers(0, len(line)))]
    return "\n".join(lines) + "\n"


def check_loads_or_fails_cleanly(text: str) -> None:
    """A Scenario (whose resolved form is valid JSON) or a one-line ScenarioError, quickly."""
    start = time.perf_counter()
    try:
        scenarios = load_variants_text(text, "fuzz.yaml")
    except ScenarioError as err:
        message = str(err)
        assert "\n" not in message and message.startswith("fuzz.yaml"), message
        assert len(message) < 1000, message[:200]
    else:
        for scenario in scenarios:
            json.dumps(scenario.resolved(), allow_nan=False)  # summary.json never holds Infinity or NaN
    elapsed = time.perf_counter() - start
    assert elapsed < CASE_BUDGET_S, f"{elapsed:.1f} s for {text[:200]!r}"


def _peak_rss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


FUZZ = settings(
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.function_scoped_fixture,  # memory_budget: once per test, not per case
    ],
)


@pytest.fixture
def memory_budget():
    before = _peak_rss_kb()
    yield
    grown = _peak_rss_kb() - before
    assert grown < MEMORY_BUDGET_KB, f"peak RSS grew by {grown // 1024} MiB"


def test_bundled_scenarios_load():
    """The seeds are valid: every mutation starts from a loading scenario."""
    for text in BUNDLED.values():
        assert load_variants_text(text)


@settings(FUZZ, max_examples=1500)
@given(mutated_documents())
def test_mutated_scenarios_load_or_fail_with_a_scenario_error(memory_budget, text):
    check_loads_or_fails_cleanly(text)


@settings(FUZZ, max_examples=1000)
@given(spliced_texts())
def test_spliced_yaml_loads_or_fails_with_a_scenario_error(memory_budget, text):
    check_loads_or_fails_cleanly(text)


@pytest.mark.slow
@settings(FUZZ, max_examples=4000)
@given(mutated_documents() | spliced_texts())
def test_many_more_mutations_load_or_fail_with_a_scenario_error(memory_budget, text):
    check_loads_or_fails_cleanly(text)
