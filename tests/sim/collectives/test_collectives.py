"""Collectives: simulated times equal the alpha-beta closed forms, the real buffers equal numpy's
answer for every op x algorithm x group x dtype x topology, `auto` follows its documented rule, and
the `collective` command prints nccl-tests-style rows."""

import json
import math

import numpy as np
import pytest

from clustersim.sim.cli import main
from clustersim.sim.collectives import ALGORITHMS, CollectiveError, auto_algorithm, nccl, resolve, time_collective
from clustersim.sim.collectives.fabric import describe
from clustersim.sim.collectives.nccl_table import BUSBW_FACTOR, parse_sizes, sweep
from clustersim.sim.collectives.ops import OPS
from clustersim.sim.collectives.ring import pipeline_slices
from clustersim.sim.scenario.spec import parse_spec
from clustersim.topologies.fattree import fat_tree
from clustersim.topologies.ring import ring
from clustersim.topologies.switch import switch

B = 100e9  # bytes/s per link direction
A = 1e-6  # seconds per link
KiB, MiB, GiB = 2**10, 2**20, 2**30
SWEEP = parse_sizes("1KiB:1GiB")  # 21 sizes
ROOTED = ("broadcast", "reduce", "gather", "scatter")


def close(t: float, expected: float, rel: float = 1e-9) -> bool:
    return abs(t - expected) <= rel * expected


# --- time: closed forms -------------------------------------------------------------------------


@pytest.mark.parametrize("n", [4, 8, 16])
def test_ring_all_reduce_on_a_ring_is_2_n_minus_1_steps_of_alpha_plus_m_over_nb(n):
    graph = ring(n, B, A)
    for m in SWEEP:
        t, _ = time_collective(graph, "all_reduce", "ring", None, m)
        assert t == pytest.approx(2 * (n - 1) * A + 2 * (n - 1) / n * m / B, rel=0.01), m


@pytest.mark.parametrize("n", [4, 8, 16])
def test_ring_all_reduce_busbw_at_1GiB_is_within_1_percent_of_the_link(n):
    (row,) = sweep(ring(n, B, A), "all_reduce", "ring", [GiB])
    assert row["busbw_GBps"] == pytest.approx(B / 1e9, rel=0.01)
    assert row["algbw_GBps"] == pytest.approx(row["busbw_GBps"] * n / (2 * (n - 1)))


@pytest.mark.parametrize("n", [4, 8, 16])
def test_bidirectional_ring_uses_both_directions(n):
    graph = ring(n, B, A)
    for m in (KiB, MiB, GiB):
        assert close(
            time_collective(graph, "all_reduce", "ring_bidir", None, m)[0], 2 * (n - 1) * (A + m / (2 * n * B))
        )
        for op in ("reduce_scatter", "all_gather"):
            assert close(time_collective(graph, op, "ring_bidir", None, m)[0], (n - 1) * (A + m / (2 * n * B)))
            assert close(time_collective(graph, op, "ring", None, m)[0], (n - 1) * (A + m / (n * B)))


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_tree_and_halving_doubling_closed_forms_on_a_switch(n):
    graph, alpha, depth = switch(n, B, A), 2 * A, math.log2(n)  # a switch path is two links
    for m in (KiB, MiB, GiB):

        def t(op: str, algo: str, m: float = m) -> float:
            return time_collective(graph, op, algo, None, m)[0]

        assert close(t("all_reduce", "tree"), 2 * depth * (alpha + m / B))
        assert close(t("broadcast", "tree"), depth * (alpha + m / B))
        assert close(t("reduce", "tree"), depth * (alpha + m / B))
        assert close(t("gather", "tree"), depth * alpha + (n - 1) / n * m / B)
        assert close(t("scatter", "tree"), depth * alpha + (n - 1) / n * m / B)
        assert close(t("all_reduce", "halving_doubling"), 2 * depth * alpha + 2 * (n - 1) / n * m / B)
        assert close(t("reduce_scatter", "halving_doubling"), depth * alpha + (n - 1) / n * m / B)
        assert close(t("all_gather", "halving_doubling"), depth * alpha + (n - 1) / n * m / B)


@pytest.mark.parametrize("n", [3, 8])
def test_direct_pairwise_chain_and_p2p_closed_forms_on_a_switch(n):
    graph, alpha, m = switch(n, B, A), 2 * A, 64 * MiB

    def t(op: str, algo: str) -> float:
        return time_collective(graph, op, algo, None, m)[0]

    assert close(t("all_reduce", "direct"), 2 * alpha + 2 * (n - 1) / n * m / B)
    assert close(t("all_to_all", "direct"), alpha + (n - 1) / n * m / B)
    assert close(t("all_to_all", "pairwise"), (n - 1) * (alpha + m / (n * B)))
    assert close(t("broadcast", "direct"), alpha + (n - 1) * m / B)
    assert close(t("p2p", "direct"), alpha + m / B)
    slices = pipeline_slices(m)
    assert slices == 128  # 512 KiB slices
    assert close(t("broadcast", "ring"), (n - 2 + slices) * (alpha + m / (slices * B)))
    assert close(t("reduce", "ring"), (n - 2 + slices) * (alpha + m / (slices * B)))


@pytest.mark.parametrize("axes", [(4, 4), (4, 4, 4), (8,), (3, 3, 3)])
def test_torus_all_reduce_keeps_every_axis_busy(axes):
    """k parts, each through the axes in its own rotated order, side by side: on a d^k torus
    T = 2 k (d - 1) alpha + (n-1)/n M / (k B) (the module docstring), the bandwidth term of a ring at
    the rank's whole injection bandwidth 2kB."""
    n, m, k, d = math.prod(axes), GiB, len(axes), axes[0]
    t, _ = time_collective(
        parse_spec("torus:" + "x".join(map(str, axes)), link_bandwidth_Bps=B, link_latency_s=A),
        "all_reduce",
        "torus",
        None,
        m,
    )
    assert close(t, 2 * k * (d - 1) * A + (n - 1) / n * m / (k * B))


def test_torus_all_reduce_with_unequal_axes_is_no_slower_than_one_axis_at_a_time():
    """On 2 x 3 the parts fall out of step; the bound is the one-axis-at-a-time schedule's time
    (a 2-wide axis is one duplex link both directions share)."""
    m = GiB
    t, _ = time_collective(
        parse_spec("torus:2x3", link_bandwidth_Bps=B, link_latency_s=A), "all_reduce", "torus", None, m
    )
    one_at_a_time, block = 0.0, m
    for k in (2, 3):
        share = 2 if k == 2 else 1
        one_at_a_time += 2 * (k - 1) * (A + share * block / (2 * k * B))
        block /= k
    assert t <= one_at_a_time * (1 + 1e-9)


def test_hierarchical_all_reduce_closed_form_on_a_fat_tree():
    nodes, per_node, nvlink, nic, m = 4, 4, 400e9, 50e9, GiB
    graph = fat_tree(nodes, per_node, nvlink, nic, latency_s=A)
    t, _ = time_collective(graph, "all_reduce", "hierarchical", None, m)
    intra = 2 * (per_node - 1) * (2 * A + m / (per_node * nvlink))  # GPU -> NVSwitch -> GPU
    inter = 2 * (nodes - 1) * (4 * A + m / (per_node * nodes * nic))  # GPU -> NIC -> leaf -> NIC -> GPU
    assert close(t, intra + inter)
    assert t < time_collective(graph, "all_reduce", "ring", None, m)[0] / 4


def test_uneven_pairwise_all_to_all_steps_last_as_long_as_their_largest_piece():
    n, alpha = 5, 2 * A
    rng = np.random.default_rng(1)
    pair_bytes = rng.integers(0, 8, size=(n, n)) * MiB
    t, _ = time_collective(switch(n, B, A), "all_to_all", "pairwise", None, pair_bytes)
    expected = sum(alpha + max(pair_bytes[i, (i + k) % n] for i in range(n)) / B for k in range(1, n))
    assert close(t, expected)


def test_timing_does_not_depend_on_the_small_buffers():
    graph = switch(6, B, A)
    bare, none = time_collective(graph, "all_reduce", "ring", None, MiB)
    with_data, out = time_collective(graph, "all_reduce", "ring", None, MiB, [np.arange(7)] * 6)
    assert none is None and bare == with_data and out[0].tolist() == (6 * np.arange(7)).tolist()


# --- data: every op x algorithm gives numpy's answer --------------------------------------------


def make_inputs(op: str, n: int, dtype, rng, counts=None) -> list[np.ndarray]:
    """Lengths chosen not to divide by n, so chunk remainders are exercised."""

    def draw(size):
        if np.issubdtype(dtype, np.integer):
            return rng.integers(-50, 50, size=size).astype(dtype)
        return rng.standard_normal(size).astype(dtype)

    if op in ("all_gather", "gather"):
        return [draw(r % 3 + 1) for r in range(n)]
    if op == "all_to_all":
        return [draw(int(counts[r].sum())) for r in range(n)]
    return [draw(2 * n + 3) for _ in range(n)]


def expected(op: str, x: list[np.ndarray], reduce_op: str, root: int, counts) -> list:
    """numpy's answer, written out independently of sim.collectives.ops."""
    n = len(x)
    red = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[reduce_op]

    def total() -> np.ndarray:
        return red(np.stack(x), axis=0).astype(x[0].dtype)  # int32 sums wrap like int32

    if op == "all_reduce":
        return [total()] * n
    if op == "reduce":
        return [total() if r == root else None for r in range(n)]
    if op == "reduce_scatter":
        return np.array_split(total(), n)
    if op == "all_gather":
        return [np.concatenate(x)] * n
    if op == "gather":
        return [np.concatenate(x) if r == root else None for r in range(n)]
    if op == "broadcast":
        return [x[root]] * n
    if op == "scatter":
        return np.array_split(x[root], n)
    if op == "p2p":
        return [x[(r - 1) % n] for r in range(n)]
    if op == "all_to_all":
        cuts = [np.split(x[i], np.cumsum(counts[i])[:-1]) for i in range(n)]
        return [np.concatenate([cuts[i][j] for i in range(n)]) for j in range(n)]
    raise AssertionError(op)


def assert_matches(got: list, want: list, x: list[np.ndarray], op: str, reduce_op: str) -> None:
    """Integers, max, min and pure moves: bit-exact. Float sums: the summation order differs from
    numpy's, and any order of adding n terms is within gamma_{n-1} = (n-1)u / (1 - (n-1)u) of
    sum |x_i| of the exact sum (Higham, Accuracy and Stability of Numerical Algorithms, sec. 4.2;
    u = eps/2), so that is the bound we allow, element by element."""
    assert len(got) == len(want)
    exact = (
        np.issubdtype(x[0].dtype, np.integer)
        or reduce_op in ("max", "min")
        or op not in ("all_reduce", "reduce", "reduce_scatter")
    )
    if not exact:
        k, u = len(x) - 1, np.finfo(x[0].dtype).eps / 2
        bound = k * u / (1 - k * u) * np.sum(np.abs(np.stack(x).astype(np.float64)), axis=0)
        if op == "reduce_scatter":
            bound = np.array_split(bound, len(x))
    for r, (g, w) in enumerate(zip(got, want)):
        if w is None:
            assert g is None, r
            continue
        assert g.dtype == w.dtype and g.shape == w.shape, (r, g.dtype, g.shape)
        if exact:
            assert np.array_equal(g, w), (r, g, w)
        else:
            b = bound[r] if op == "reduce_scatter" else bound
            assert np.all(np.abs(g.astype(np.float64) - w.astype(np.float64)) <= b), (r, g, w)


def refusal(op: str, algo: str, graph, n: int) -> str | None:
    """The error an algorithm gives where it does not apply (None: it applies)."""
    fabric = describe(graph)
    if algo == "halving_doubling" and n & (n - 1):
        return "power-of-two"
    if algo == "hierarchical" and fabric.node_of_gpu is None:
        return "node structure"
    if algo == "torus" and (fabric.dims is None or n != fabric.num_gpus):
        return "torus topology"
    if algo in nccl.ALGOS and fabric.nccl is None:
        return "NCCL layer"
    one_node = fabric.node_of_gpu is None or len(set(fabric.node_of_gpu[:n])) == 1
    if (algo, one_node) in (("nvls", False), ("nvls_tree", True)):
        return "NVLS"
    return None


def run_case(graph, op, algo, n, dtype, reduce_op="sum", seed=0, group=None):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 4, size=(n, n)) if op == "all_to_all" else None
    x = make_inputs(op, n, dtype, rng, counts)
    root = n // 2 if op in ROOTED else 0
    group = list(range(n)) if group is None else group
    why_not = refusal(op, algo, graph, n)
    if why_not:
        with pytest.raises(CollectiveError, match=why_not):
            time_collective(graph, op, algo, group, MiB, x, reduce_op, root=root, counts=counts)
        return
    _, got = time_collective(graph, op, algo, group, MiB, x, reduce_op, root=root, counts=counts)
    assert_matches(got, expected(op, x, reduce_op, root, counts), x, op, reduce_op)


PAIRS = [(op, algo) for op in OPS for algo in [*ALGORITHMS[op], "auto"]]


@pytest.mark.parametrize("op,algo", PAIRS, ids=[f"{o}-{a}" for o, a in PAIRS])
def test_every_algorithm_matches_numpy_on_a_switch(op, algo):
    graph = switch(8, B, A)
    for n in (1, 2, 3, 4, 5, 8):
        for dtype in (np.int64, np.int32, np.float64, np.float32):
            run_case(graph, op, algo, n, dtype, seed=n)


@pytest.mark.parametrize("op,algo", PAIRS, ids=[f"{o}-{a}" for o, a in PAIRS])
@pytest.mark.parametrize(
    "spec",
    [
        "ring:6",
        "torus:4x4",
        "torus:2x2x2",
        "mesh:3x3",
        "fattree:nodes=3,gpus_per_node=2",
        "fattree:nodes=2,gpus_per_node=4",
    ],
)
def test_every_algorithm_matches_numpy_on_every_topology(spec, op, algo):
    graph = parse_spec(spec)
    n = describe(graph).num_gpus
    run_case(graph, op, algo, n, np.int64)
    run_case(graph, op, algo, n, np.float64, seed=1)


NCCL_PAIRS = [(op, algo) for op in OPS for algo in ALGORITHMS[op] if algo in nccl.ALGOS]


@pytest.mark.parametrize("op,algo", NCCL_PAIRS, ids=[f"{o}-{a}" for o, a in NCCL_PAIRS])
@pytest.mark.parametrize("spec", ["dgx:1", "fattree:nodes=3,gpus_per_node=2", "fattree:nodes=4,gpus_per_node=4"])
@pytest.mark.parametrize("pxn", [True, False])
def test_nccl_algorithms_match_numpy(spec, op, algo, pxn):
    graph = parse_spec(spec)
    graph.graph[nccl.NCCL] = nccl.NcclConfig(system="H100", pxn=pxn)
    n = describe(graph).num_gpus
    run_case(graph, op, algo, n, np.int64)
    run_case(graph, op, algo, n, np.float64, seed=1)
    run_case(graph, op, "auto", n, np.int64)
    for group in ([n - 1], [n - 1, 1, 2]):  # one rank; a few scattered over nodes, out of order
        run_case(graph, op, "auto", len(group), np.int64, group=group)


@pytest.mark.parametrize("op", ["all_reduce", "reduce", "reduce_scatter"])
@pytest.mark.parametrize("reduce_op", ["max", "min", "prod"])
def test_max_min_prod_reductions(op, reduce_op):
    graph = switch(8, B, A)
    for algo in ALGORITHMS[op]:
        for n in (3, 4, 8):
            run_case(graph, op, algo, n, np.int64, reduce_op, seed=n)
            if reduce_op != "prod":
                run_case(graph, op, algo, n, np.float32, reduce_op, seed=n)


def test_a_group_of_scattered_gpus_in_any_order():
    graph = fat_tree(2, 4, 400e9, 50e9, latency_s=A)
    for op in OPS:
        for algo in ALGORITHMS[op]:
            run_case(graph, op, algo, 4, np.int64, group=[6, 1, 3, 4])


def test_all_reduce_keeps_the_buffer_shape():
    x = [np.arange(12).reshape(3, 4) * (r + 1) for r in range(4)]
    _, out = time_collective(switch(4, B, A), "all_reduce", "ring", None, MiB, x)
    assert out[0].shape == (3, 4) and np.array_equal(out[3], 10 * np.arange(12).reshape(3, 4))


def test_p2p_pair_swaps_buffers():
    _, out = time_collective(switch(4, B, A), "p2p", "direct", [3, 1], KiB, [np.array([1, 2]), np.array([3, 4])])
    assert [o.tolist() for o in out] == [[3, 4], [1, 2]]


# --- names, auto and errors ---------------------------------------------------------------------


def test_a_miss_lists_the_valid_names():
    with pytest.raises(
        CollectiveError,
        match=r"unknown algorithm 'rings' for all_gather \(valid: auto, ring, "
        r"ring_bidir, halving_doubling, direct, nccl_ring\)",
    ):
        time_collective(switch(4, B, A), "all_gather", "rings", None, KiB)
    with pytest.raises(CollectiveError, match="unknown collective 'allreduce'.*all_reduce"):
        time_collective(switch(4, B, A), "allreduce", "ring", None, KiB)
    with pytest.raises(CollectiveError, match="unknown reduction 'avg'"):
        time_collective(switch(4, B, A), "all_reduce", "ring", None, KiB, reduce_op="avg")
    with pytest.raises(CollectiveError, match="names a GPU twice"):
        time_collective(switch(4, B, A), "all_reduce", "ring", [0, 0], KiB)


def test_every_collective_has_algorithms_and_a_busbw_factor():
    assert set(ALGORITHMS) == set(OPS) == set(BUSBW_FACTOR)
    assert {op: BUSBW_FACTOR[op](8) for op in ("all_reduce", "all_gather", "all_to_all", "broadcast")} == {
        "all_reduce": 1.75,
        "all_gather": 0.875,
        "all_to_all": 0.875,
        "broadcast": 1.0,
    }


@pytest.mark.parametrize(
    "spec,op,nbytes,algo",
    [
        ("torus:4x4x4", "all_reduce", GiB, "torus"),
        ("torus:4x4", "all_reduce", KiB, "torus"),
        ("fattree:nodes=4,gpus_per_node=8", "all_reduce", GiB, "hierarchical"),
        ("fattree:nodes=4,gpus_per_node=8", "all_to_all", GiB, "direct"),
        ("switch:8", "all_reduce", 64 * KiB, "halving_doubling"),
        ("switch:6", "all_reduce", 64 * KiB, "tree"),
        ("switch:8", "all_reduce", GiB, "ring"),
        ("ring:8", "all_reduce", GiB, "ring"),
        ("ring:8", "all_gather", KiB, "halving_doubling"),
        ("ring:6", "reduce_scatter", KiB, "ring"),
        ("switch:8", "broadcast", KiB, "tree"),
        ("switch:8", "reduce", GiB, "ring"),
        ("switch:8", "gather", KiB, "tree"),
        ("switch:8", "scatter", GiB, "direct"),
        ("switch:8", "p2p", GiB, "direct"),
    ],
)
def test_auto_picks_what_the_registry_documents(spec, op, nbytes, algo):
    graph = parse_spec(spec)
    assert resolve(graph, op, "auto", range(describe(graph).num_gpus), nbytes) == algo


def test_auto_on_part_of_a_torus_or_one_node_is_flat():
    torus = describe(parse_spec("torus:4x4"))
    assert auto_algorithm("all_reduce", torus, list(range(8)), GiB) == "ring"
    tree = describe(parse_spec("fattree:nodes=2,gpus_per_node=4"))
    assert auto_algorithm("all_reduce", tree, [0, 1, 2, 3], GiB) == "ring"


# --- the command line ---------------------------------------------------------------------------


def test_parse_sizes_doubles_like_nccl_tests():
    assert len(SWEEP) == 21 and SWEEP[0] == KiB and SWEEP[-1] == GiB
    assert all(b == 2 * a for a, b in zip(SWEEP, SWEEP[1:]))
    assert parse_sizes("1MiB") == [MiB]
    assert parse_sizes("1KiB:16KiB:4") == [KiB, 4 * KiB, 16 * KiB]


@pytest.mark.parametrize(
    "text,reason",
    [
        ("1e400", "from 1 to"),  # found by the command-line fuzz test: an OverflowError
        ("2PiB", "from 1 to"),
        ("1:1PiB:1.001", "34,675 sizes; at most 1000"),  # would sweep for hours
    ],
)
def test_parse_sizes_refuses_sweeps_out_of_bounds(text, reason):
    with pytest.raises(ValueError, match=reason):
        parse_sizes(text)


def test_cli_prints_an_nccl_tests_table(capsys):
    assert (
        main(
            [
                "collective",
                "all_reduce",
                "--topology",
                "ring:8",
                "--sizes",
                "1KiB:4KiB",
                "--algo",
                "ring",
                "--link_bandwidth",
                "100GB/s",
                "--link-latency",
                "1us",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("# all_reduce on ring:8")
    for header in ("size (B)", "count", "type", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong"):
        assert header in lines[1]
    assert len(lines) == 2 + 1 + 3 and lines[3].split()[:3] == ["1024", "256", "float"]


def test_cli_json_rows(capsys):
    assert main(["collective", "all_to_all", "--topology", "switch:4", "--sizes", "1MiB:2MiB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["size_bytes"] for r in rows] == [MiB, 2 * MiB]
    assert {"size_bytes", "count", "type", "time_us", "algbw_GBps", "busbw_GBps", "algo", "wrong"} <= set(rows[0])
    row = rows[1]
    assert row["algbw_GBps"] == pytest.approx(row["size_bytes"] / (row["time_us"] * 1e-6) / 1e9)
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 3 / 4) and row["wrong"] == 0


@pytest.mark.parametrize(
    "args,flag,reason",
    [
        (["allreduce", "--topology", "ring:4", "--sizes", "1KiB"], "OP", "unknown collective 'allreduce'"),
        (["all_reduce", "--topology", "ring:4", "--sizes", "1KiB", "--algo", "rign"], "--algo", "valid: auto, ring"),
        (["all_reduce", "--topology", "switch:4", "--sizes", "1KiB", "--algo", "torus"], "--algo", "torus topology"),
        (
            ["all_reduce", "--topology", "switch:6", "--sizes", "1KiB", "--algo", "halving_doubling"],
            "--algo",
            "power-of-two",
        ),
        (["all_reduce", "--topology", "hypercube:4", "--sizes", "1KiB"], "--topology", "unknown kind"),
        (["all_reduce", "--topology", "ring:4", "--sizes", "1GiB:1KiB"], "--sizes", "below the smallest"),
        (["all_reduce", "--topology", "ring:4", "--sizes", "lots"], "--sizes", "not a size"),
        (
            ["all_reduce", "--topology", "ring:4", "--sizes", "1KiB", "--link_bandwidth", "fast"],
            "--link_bandwidth",
            "not a bandwidth",
        ),
        (
            ["all_reduce", "--topology", "fattree:nodes=2", "--sizes", "1KiB", "--link_bandwidth", "1GB/s"],
            "--link_bandwidth",
            "not used by topology kind 'fattree'",
        ),
        (["broadcast", "--topology", "ring:4", "--sizes", "1KiB", "--root", "4"], "--root", "not a GPU"),
        (["all_reduce", "--topology", "ring:4", "--sizes", "1KiB", "--redop", "avg"], "--redop", "unknown redop"),
        # one GPU moves nothing: its time would be 0 and its bandwidth infinite (not JSON)
        (["all_reduce", "--topology", "ring:1", "--sizes", "1MiB", "--json"], "--topology", "at least 2 GPUs"),
    ],
)
def test_cli_bad_options_are_one_line_and_exit_2(capsys, args, flag, reason):
    assert main(["collective", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"clustersim: error: (command line): {flag}: "), err
    assert reason in err, err
