"""Fuzzing the command line (issue 16, acceptance 2): random argument lists for every command (the
real flags with wrong, huge, negative, empty or hostile values; topology specs mutated; paths that
do not exist, are folders or files, hold a NUL byte or 300 characters; unknown words) end in
exit 0 or 2, never another exception, within a time budget per case; a clustersim error is one
line on stderr. A case that simulates does so on the 4-GPU quickstart or a fabric of at most 64 GPUs
(bigger ones must be refused at once), so the whole test stays in seconds.

The default run tries 300 cases; the `slow` one 1,500 more."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clustersim.sim.cli import main

from repo import QUICKSTART

CASE_BUDGET_S = 20.0  # per case: the slowest legitimate case simulates the quickstart (about 1 s)

NUMBERS = ["0", "1", "2", "3", "4", "8", "-1", "-8", "2" * 30, "1e400", "nan", "inf", "0.5", "", " ", "x"]
SIZES = ["8", "1KiB", "1KiB:1MiB", "1KiB:1MiB:4", "8:8", "1MiB:1KiB", "0", "-4", "1e400", "1GiB:1PiB:1", "nan", "KiB"]
SPECS = [
    "ring:8",
    "ring:1",
    "ring:0",
    "switch:16",
    "switch:2,bandwidth=1e300GB/s",
    "torus:4x4",
    "torus:4x4x4",
    "torus:0x4",
    "torus:100000x100000",
    "mesh:4",
    "fattree:nodes=2,gpus_per_node=4",
    "fattree:nodes=2,gpus_per_node=4,leaf_radix=1",
    "fattree:nodes=3,leaf_radix=2,tiers=3",
    "dgx:1",
    "dgx:2",
    "dgx:1,nvlink_bandwidth=-1GB/s",
    "dragonfly:nodes=8",
    "torus:4x4,link_bandwidth=",
    "nonsense:4",
    ":",
    "",
]
WORDS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "p2p", "gather", "bogus"]
WORDS += ["1f1b", "gpipe", "interleaved", "zbv", "dualpipev", "auto", "ring", "tree", "float", "int8", "sum", "max"]
WORDS += ["A100", "H100", "off", "LL", "LL128", "Simple", "nccl_ring", "nvls", "pxn", "bogus"]


def paths(tmp: str) -> st.SearchStrategy[str]:
    return st.sampled_from(
        [
            str(QUICKSTART),
            os.path.join(tmp, "missing.yaml"),
            tmp,
            os.path.join(tmp, "plain.txt"),
            os.path.join(tmp, "nul\0byte"),
            os.path.join(tmp, "n" * 300),
            os.path.join(tmp, "out"),
            os.path.join(tmp, "a", "b", "c"),
            ".",
            "",
        ]
    )


def argument_lists(tmp: str) -> st.SearchStrategy[list[str]]:
    """A command, then a shuffle of its flags (real and unknown) with values drawn from the lists above."""
    value = st.sampled_from(NUMBERS) | st.sampled_from(SIZES) | st.sampled_from(SPECS) | st.sampled_from(WORDS)
    value |= paths(tmp) | st.text(max_size=12)
    flags = {
        "run": ["-o", "--outputs", "--format", "--max-memory", "--no-plots", "--no-trace", "--no-program"],
        "compare": ["-o", "--max-memory"],
        "schema": [],
        "schedule": ["--kind", "--pp", "--microbatches", "--virtual", "--json"],
        "collective": [
            *("--topology", "--sizes", "--algo", "--type", "--redop", "--root", "--json", "--csv", "--nccl"),
            *("--protocol", "--no-tree", "--no-nvls", "--no-pxn", "--copy-engine", "--plot"),
        ],
        "topology": ["-o", "--link-bandwidth", "--nodes"],
    }
    lone = {"--no-plots", "--no-trace", "--no-program", "--json", "--csv", "--no-tree", "--no-nvls", "--no-pxn"}
    lone |= {"--copy-engine"}

    @st.composite
    def build(draw) -> list[str]:
        command = draw(st.sampled_from([*flags, "bogus", "--version", ""]))
        argv = [command]
        if command in ("run", "compare", "topology", "collective"):
            source = paths(tmp) if command != "collective" else st.sampled_from(WORDS)
            if command == "topology":
                source = source | st.sampled_from(SPECS)
            argv += draw(st.lists(source, min_size=1, max_size=2 if command == "compare" else 1))
        if command == "collective":  # its required flags, so that some cases time a collective
            argv += ["--topology", draw(st.sampled_from(SPECS)), "--sizes", draw(st.sampled_from(SIZES))]
        if command == "schedule":
            kind, count = st.sampled_from(WORDS), st.sampled_from(NUMBERS)
            argv += ["--kind", draw(kind), "--pp", draw(count), "--microbatches", draw(count)]
        for flag in draw(st.lists(st.sampled_from([*flags.get(command, []), "--bogus"]), max_size=5)):
            argv += [flag] if flag in lone else [flag, draw(value)]
        if command == "run" and "--outputs" not in argv:
            argv += ["--outputs", "summary.json"]  # keep cases cheap: no plots or trace
        return argv

    return build()


@pytest.fixture(scope="module")
def playground(tmp_path_factory):
    """A folder to run in (so `-o .` and relative paths land here), with a plain file in it."""
    tmp = tmp_path_factory.mktemp("cli_fuzz")
    (tmp / "plain.txt").write_text("a user's file\n")
    return tmp


FUZZ = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)


def check_ends_cleanly(argv: list[str], tmp, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp)
    start = time.perf_counter()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: a usage error (2), --version or --help (0)
        code = exc.code if isinstance(exc.code, int) else 2
    elapsed = time.perf_counter() - start
    out, err = capsys.readouterr()
    assert code in (0, 2), (argv, code, err[-500:])
    assert elapsed < CASE_BUDGET_S, (argv, elapsed)
    ours = [line for line in err.splitlines() if line.startswith("clustersim: error:")]
    if code == 2 and ours and "usage:" not in err:
        assert len(err.strip().splitlines()) == 1, (argv, err)
    assert (tmp / "plain.txt").read_text() == "a user's file\n", argv  # never touched


def fuzz(playground, capsys, monkeypatch, examples: int) -> None:
    @settings(FUZZ, max_examples=examples)
    @given(argument_lists(str(playground)))
    def case(argv):
        check_ends_cleanly(argv, playground, capsys, monkeypatch)

    case()


def test_the_command_line_ends_in_success_or_a_clean_error(playground, capsys, monkeypatch):
    fuzz(playground, capsys, monkeypatch, 300)


@pytest.mark.slow
def test_many_more_command_lines_end_cleanly(playground, capsys, monkeypatch):
    fuzz(playground, capsys, monkeypatch, 1500)
