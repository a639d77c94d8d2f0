"""What each collective means: its inputs, where data sits in the per-rank work buffers, its outputs.

Inputs are one numpy array per rank of the group (`buffers[r]`, any dtype, all the same dtype);
outputs are one array (or None) per rank. `nbytes` is the real size in nccl-tests' meaning.

| op | input of rank r | output of rank r | size (nbytes) |
| --- | --- | --- | --- |
| all_reduce | x_r (any shape, all alike) | x_0 + ... + x_{n-1} | one rank's buffer |
| reduce_scatter | x_r (L elements) | chunk r of the sum (array_split of L into n) | L elements |
| all_gather | x_r (lengths may differ) | concatenation x_0 ... x_{n-1} | the concatenation |
| broadcast | x_root (others ignored) | x_root | one buffer |
| reduce | x_r | the sum at the root, None elsewhere | one buffer |
| gather | x_r | the concatenation at the root, None elsewhere | the concatenation |
| scatter | x_root of L elements | chunk r of x_root | L elements |
| all_to_all | x_r = pieces r->0, ..., r->n-1 | pieces 0->r, ..., (n-1)->r | one rank's send buffer |
| p2p (sendrecv) | x_r | x_{r-1 mod n} | one buffer |

all_to_all pieces are x_r cut like numpy.array_split into n, or by `counts[r][j]` elements
(uneven); its real sizes are nbytes/n per piece, or an (n, n) matrix `nbytes[i][j]`.
"+" is the reduction: sum, prod, max or min (REDUCE_OPS).

Work buffers are flat: rank r's work buffer holds the whole result-sized array (all_to_all: its send
area then its receive area), so every algorithm moves element ranges of one array per rank.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from clustersim.sim.collectives.steps import CollectiveError, Plan, split_bounds


class Pieces(NamedTuple):
    """One rank's all_to_all input cut unevenly, as its owner knows it: counts[j] elements of
    `flat` go to rank j, and the piece's real bytes are shares[j] x nbytes (None: nbytes / n, the
    even cut). An MoE layer's routing decides both."""

    flat: np.ndarray
    counts: np.ndarray
    shares: np.ndarray | None = None


def unpack_pieces(buffers: list, nbytes: float) -> tuple[list, np.ndarray | None, float | np.ndarray]:
    """(flat buffers, counts matrix or None, nbytes or its (n, n) matrix) of an all_to_all's inputs
    that may be `Pieces`: the matrices are their rows stacked."""
    if not buffers or not isinstance(buffers[0], Pieces):
        return buffers, None, nbytes
    counts = np.array([b.counts for b in buffers])
    flats = [b.flat for b in buffers]
    if buffers[0].shares is None:
        return flats, counts, nbytes
    return flats, counts, float(nbytes) * np.array([b.shares for b in buffers], dtype=float)


OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "gather", "scatter", "all_to_all", "p2p")
REDUCE_OPS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
REDUCING = ("all_reduce", "reduce_scatter", "reduce")
ROOTED = ("broadcast", "reduce", "gather", "scatter")


def _check_count(op: str, buffers: list, n: int) -> None:
    if len(buffers) != n:
        raise CollectiveError(f"{op}: {len(buffers)} buffers for a group of {n} ranks")


def _check_buffers(op: str, buffers: list, n: int) -> list[np.ndarray]:
    """Every rank's input as an array (ops that read them all: not broadcast or scatter)."""
    _check_count(op, buffers, n)
    arrays = [np.asarray(b) for b in buffers]
    dtypes = {a.dtype for a in arrays}
    if len(dtypes) > 1:
        raise CollectiveError(f"{op}: buffers of different dtypes {sorted(map(str, dtypes))}")
    if op in ("all_reduce", "reduce", "reduce_scatter", "p2p") and len({a.shape for a in arrays}) > 1:
        raise CollectiveError(f"{op}: buffers of different shapes {sorted({a.shape for a in arrays})}")
    return arrays


def prepare(
    op: str, n: int, nbytes, buffers: list | None, root: int = 0, counts=None, nodes=None, dims=None, nccl=None
) -> tuple[Plan, list[np.ndarray] | None]:
    """The plan every algorithm reads, and the ranks' work buffers (None when only timing)."""
    if op not in OPS:
        raise CollectiveError(f"unknown collective {op!r} (valid: {', '.join(OPS)})")
    if not 0 <= root < n:
        raise CollectiveError(f"{op}: root {root} is not a rank of a group of {n}")
    if np.ndim(nbytes) != 0 and op != "all_to_all":
        raise CollectiveError(f"{op}: nbytes must be one number (a matrix is for all_to_all)")
    common = dict(n=n, root=root, nodes=nodes, dims=dims, nccl=nccl)
    if op == "all_to_all":
        return _prepare_all_to_all(n, nbytes, buffers, counts, common)
    if buffers is None:
        return Plan(nbytes=float(nbytes), bounds=split_bounds(0, n), **common), None
    if op in ("broadcast", "scatter"):  # only the root's input is read
        _check_count(op, buffers, n)
        source = np.asarray(buffers[root]).reshape(-1)
        bounds = split_bounds(len(source), n)
        work = [source.copy() if r == root else np.zeros_like(source) for r in range(n)]
        return Plan(nbytes=float(nbytes), bounds=bounds, **common), work
    flat = [a.reshape(-1) for a in _check_buffers(op, buffers, n)]
    if op in ("all_gather", "gather"):
        bounds = np.concatenate([[0], np.cumsum([len(a) for a in flat])])
        work = [np.zeros(bounds[-1], dtype=flat[0].dtype) for _ in range(n)]
        for r in range(n):
            work[r][bounds[r] : bounds[r + 1]] = flat[r]
    else:  # all_reduce, reduce_scatter, reduce, p2p: every rank starts with its own whole buffer
        bounds = split_bounds(len(flat[0]), n)
        work = [a.copy() for a in flat]
    return Plan(nbytes=float(nbytes), bounds=bounds, **common), work


def _prepare_all_to_all(n: int, nbytes, buffers, counts, common) -> tuple[Plan, list[np.ndarray] | None]:
    pair_bytes = np.asarray(nbytes, dtype=float)
    if pair_bytes.ndim == 0:
        pair_bytes = np.full((n, n), float(nbytes) / n)
    elif pair_bytes.shape != (n, n):
        raise CollectiveError(f"all_to_all: nbytes matrix of shape {pair_bytes.shape}, expected ({n}, {n})")
    x = None if buffers is None else _check_buffers("all_to_all", buffers, n)
    if counts is None:
        lengths = [0] * n if x is None else [a.size for a in x]
        counts = np.array([np.diff(split_bounds(length, n)) for length in lengths])
    counts = np.asarray(counts, dtype=np.int64)
    if counts.shape != (n, n) or (counts < 0).any():
        raise CollectiveError(f"all_to_all: counts must be an ({n}, {n}) matrix of element counts >= 0")
    if x is not None and any(a.size != c for a, c in zip(x, counts.sum(axis=1))):
        raise CollectiveError(
            f"all_to_all: buffer sizes {[a.size for a in x]} != counts row sums {counts.sum(axis=1).tolist()}"
        )
    sent = counts.sum(axis=1)  # (n,) elements each rank sends = the start of its receive area
    send_off = np.cumsum(counts, axis=1) - counts
    recv_off = sent[None, :] + np.cumsum(counts, axis=0) - counts  # [i, j]: where i's piece lands in j
    plan = Plan(
        nbytes=float(pair_bytes.sum() / n),
        bounds=split_bounds(0, n),
        counts=counts,
        send_off=send_off,
        recv_off=recv_off,
        pair_bytes=pair_bytes,
        **common,
    )
    if x is None:
        return plan, None
    work = [np.concatenate([a.reshape(-1), np.zeros(counts[:, r].sum(), dtype=a.dtype)]) for r, a in enumerate(x)]
    return plan, work


def results(op: str, plan: Plan, work: list[np.ndarray], buffers: list) -> list[np.ndarray | None]:
    """Each rank's output, read from its work buffer (shape restored where the op keeps it)."""
    n, root = plan.n, plan.root
    if op in ("all_reduce", "p2p"):
        return [w.reshape(np.shape(buffers[r])) for r, w in enumerate(work)]
    if op == "broadcast":
        return [w.reshape(np.shape(buffers[root])) for w in work]
    if op == "reduce":
        return [work[root].reshape(np.shape(buffers[root])) if r == root else None for r in range(n)]
    if op == "gather":
        return [work[root] if r == root else None for r in range(n)]
    if op in ("reduce_scatter", "scatter"):
        return [work[r][plan.chunk(r)].copy() for r in range(n)]
    if op == "all_to_all":
        if plan.counts is None:
            raise CollectiveError("all_to_all: the plan has no counts (not made by prepare)")
        sent = plan.counts.sum(axis=1)
        return [work[r][sent[r] :] for r in range(n)]
    return list(work)  # all_gather


def reference(op: str, buffers: list, reduce_op: str = "sum", root: int = 0, counts=None) -> list:
    """numpy's answer for the same inputs (what every algorithm must reproduce)."""
    n = len(buffers)

    def reduced() -> np.ndarray:
        return REDUCE_OPS[reduce_op].reduce(np.stack([np.asarray(b) for b in buffers]), axis=0)

    if op == "all_reduce":
        return [reduced()] * n
    if op == "reduce_scatter":
        return np.array_split(reduced().reshape(-1), n)
    if op == "reduce":
        return [reduced() if r == root else None for r in range(n)]
    if op in ("all_gather", "gather"):
        whole = np.concatenate([np.asarray(b).reshape(-1) for b in buffers])
        return [whole if op == "all_gather" or r == root else None for r in range(n)]
    if op == "broadcast":
        return [np.asarray(buffers[root])] * n
    if op == "scatter":
        return np.array_split(np.asarray(buffers[root]).reshape(-1), n)
    if op == "p2p":
        return [np.asarray(buffers[(r - 1) % n]) for r in range(n)]
    if op == "all_to_all":
        if counts is None:
            counts = [[len(p) for p in np.array_split(np.asarray(b).reshape(-1), n)] for b in buffers]
        pieces = [np.split(np.asarray(b).reshape(-1), np.cumsum(c)[:-1]) for b, c in zip(buffers, counts)]
        return [np.concatenate([pieces[i][j] for i in range(n)]) for j in range(n)]
    raise CollectiveError(f"unknown collective {op!r} (valid: {', '.join(OPS)})")
