"""nccl-tests-style results: a size sweep of one collective, with algbw, busbw and a data check.

Size S means what it means in nccl-tests: the per-rank buffer for all_reduce, broadcast, reduce
and p2p; the whole n-rank array for reduce_scatter, all_gather, gather and scatter; each rank's
whole send buffer for all_to_all (S/n to each peer). GB is 10^9 bytes.

    algbw = S / t                      busbw = algbw x factor(op, n)

with the factors of nccl-tests (doc/PERFORMANCE.md, "Summary", and src/*.cu *GetBw in
NVIDIA/nccl-tests): all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n;
gather, scatter (n-1)/n (src/gather.cu, src/scatter.cu); broadcast, reduce 1; sendrecv (our
p2p) 1. busbw is comparable to one link's bandwidth whatever n is.

Every row also runs the collective on small int64 buffers and counts the output elements that
differ from numpy's answer (`wrong`, nccl-tests' #wrong): exact, because integer arithmetic is.
"""

from __future__ import annotations

import math

import networkx as nx
import numpy as np

from clustersim.sim.collectives.ops import REDUCING, ROOTED, reference
from clustersim.sim.collectives.run import resolve_protocol, time_collective
from clustersim.sim.collectives.steps import CollectiveError
from clustersim.sim.results.table import format_table
from clustersim.sim.scenario.units import parse_bytes
from clustersim.topologies.schema import gpu_nodes

BUSBW_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "p2p": lambda n: 1.0,
}
TYPE_BYTES = {
    "int8": 1,
    "uint8": 1,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "half": 2,
    "bfloat16": 2,
    "float": 4,
    "double": 8,
}  # nccl-tests' type names

COLUMNS = [
    ("size_bytes", "size (B)", "d"),
    ("count", "count", "d"),
    ("type", "type", "s"),
    ("redop", "redop", "s"),
    ("root", "root", "d"),
    ("algo", "algo", "s"),
    ("protocol", "proto", "s"),
    ("time_us", "time (us)", ".2f"),
    ("algbw_GBps", "algbw (GB/s)", ".2f"),
    ("busbw_GBps", "busbw (GB/s)", ".2f"),
    ("wrong", "#wrong", "d"),
]


MAX_SIZE = 2**50  # 1 PiB: far past any buffer, and every size stays an exact float
MAX_ROWS = 1000  # sizes in one sweep


def parse_sizes(text: str) -> list[int]:
    """'1KiB:1GiB' -> 1 KiB, 2 KiB, ..., 1 GiB (x2 steps, like nccl-tests -b 1K -e 1G -f 2);
    'MIN:MAX:F' steps by F; a single size is a sweep of one. ValueError on a bad sweep."""
    parts = text.split(":")
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"{text!r} is not a size sweep; expected e.g. '1KiB:1GiB' or '1MiB'")
    low = parse_bytes(parts[0])
    high = parse_bytes(parts[1]) if len(parts) > 1 else low
    factor = _factor(parts[2]) if len(parts) > 2 else 2.0
    if not factor > 1:
        raise ValueError(f"{text!r}: the step factor must be a number > 1, got {parts[2]!r}")
    if not (1 <= low <= MAX_SIZE and 1 <= high <= MAX_SIZE and low == int(low) and high == int(high)):
        raise ValueError(f"{text!r}: sizes must be whole numbers of bytes from 1 to {MAX_SIZE:,} (1 PiB)")
    if high < low:
        raise ValueError(f"{text!r}: the largest size is below the smallest")
    if (count := math.floor(math.log(high / low, factor) + 1e-9) + 1) > MAX_ROWS:
        raise ValueError(f"{text!r}: {count:,} sizes; at most {MAX_ROWS} (a larger step factor)")
    sizes, size = [], low
    while size <= high * (1 + 1e-12):
        sizes.append(int(round(size)))
        size *= factor
    return sizes


def _factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        return math.nan
    return value if math.isfinite(value) else math.nan


def example_buffers(op: str, n: int, seed: int = 0) -> list[np.ndarray]:
    """Small int64 inputs with lengths that do not divide evenly (to exercise remainders)."""
    rng = np.random.default_rng(seed)
    if op in ("all_gather", "gather"):
        return [rng.integers(-9, 10, size=1 + r % 3) for r in range(n)]
    if op == "all_to_all":
        return [rng.integers(-9, 10, size=2 * n + r % 3) for r in range(n)]
    return [rng.integers(-9, 10, size=2 * n + 3) for _ in range(n)]


def _wrong(outputs: list, expected: list) -> int:
    """Output elements that differ from the expected ones (a missing or misshapen output: all)."""
    count = 0
    for got, want in zip(outputs, expected):
        if want is None:
            continue
        want = np.asarray(want)
        if got is None or np.shape(got) != want.shape:
            count += want.size
        else:
            count += int(np.count_nonzero(np.asarray(got) != want))
    return count


def sweep(
    graph: nx.DiGraph, op: str, algo: str, sizes: list[int], dtype: str = "float", redop: str = "sum", root: int = 0
) -> list[dict]:
    """One row per size: the collective over every GPU of `graph`, timed at that size."""
    n = len(gpu_nodes(graph))
    rows = []
    for size in sizes:
        buffers = example_buffers(op, n)
        reduce_op = redop if op in REDUCING else "sum"
        seconds, outputs = time_collective(graph, op, algo, None, float(size), buffers, reduce_op, root=root)
        if outputs is None:
            raise CollectiveError(f"{op} with {algo}: no outputs for the buffers given")
        algbw = size / seconds / 1e9 if seconds > 0 else math.inf
        name, protocol = resolve_protocol(graph, op, algo, range(n), float(size))
        rows.append(
            {
                "op": op,
                "algo": name,
                "protocol": protocol,
                "ranks": n,
                "size_bytes": size,
                "count": size // TYPE_BYTES[dtype],
                "type": dtype,
                "redop": redop if op in REDUCING else "none",
                "root": root if op in ROOTED else -1,
                "time_us": seconds * 1e6,
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * BUSBW_FACTOR[op](n),
                "wrong": _wrong(outputs, reference(op, buffers, reduce_op, root)),
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    """The rows as an nccl-tests-style text table."""
    return format_table(rows, COLUMNS)


def csv_text(rows: list[dict]) -> str:
    """The rows as CSV, every key of a row a column (the JSON's keys, in its order)."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else [], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
