"""A topology in one short string, for command lines and notebooks.

    parse_spec("ring:8")                 8 GPUs on a ring
    parse_spec("switch:16")              16 GPUs on one switch
    parse_spec("torus:4x4x4")            3D torus (also torus:8x8, torus:16)
    parse_spec("mesh:4x4")               2D mesh (no wraparound)
    parse_spec("dgx:1")                  one DGX H100-style node (dgx:N, N > 1: N of them on the default fat tree)
    parse_spec("fattree:nodes=8,gpus_per_node=8,oversubscription=2,tiers=3")

After the size, `key=value` options (plain SI numbers) set any builder argument:
ring/switch/torus/mesh take bandwidth_Bps and latency_s (defaults DEFAULT_BANDWIDTH_Bps and
DEFAULT_LATENCY_s, or the parse_spec arguments); dgx and fattree take the fat_tree arguments
(nvlink_bandwidth_Bps, nic_bandwidth_Bps, leaf_radix, oversubscription, tiers, latency_s) and
default to DGX H100 values (topologies.fattree). Every mistake is a ValueError naming the spec.
"""

from __future__ import annotations

import inspect
import re

import networkx as nx

from clustersim.topologies.fattree import HOP_LATENCY_s, fat_tree
from clustersim.topologies.registry import TOPOLOGIES
from clustersim.topologies.schema import check_schema

# An assumption for specs without a preset (ring, switch, torus, mesh): round numbers, no product.
DEFAULT_BANDWIDTH_Bps = 100e9
DEFAULT_LATENCY_s = HOP_LATENCY_s

SHAPES = {  # kind -> (what the size part looks like, the builder argument it fills)
    "ring": ("a GPU count, e.g. ring:8", "num_gpus"),
    "switch": ("a GPU count, e.g. switch:16", "num_gpus"),
    "torus": ("axis sizes, e.g. torus:4x4x4", "axes"),
    "mesh": ("axis sizes, e.g. mesh:4x4", "axes"),
    "dgx": ("a node count, e.g. dgx:1", "nodes"),
    "fattree": ("key=value options, e.g. fattree:nodes=8,gpus_per_node=8", None),
}
_LINK_KINDS = ("ring", "switch", "torus", "mesh")


def parse_spec(spec: str, bandwidth_Bps: float | None = None, latency_s: float | None = None) -> nx.DiGraph:
    """The graph a spec names. bandwidth_Bps / latency_s set the link options of kinds without a
    preset (ring, switch, torus, mesh) unless the spec gives them; fattree and dgx ignore them."""
    kind, _, body = spec.strip().partition(":")
    if kind not in SHAPES:
        raise ValueError(f"topology spec {spec!r}: unknown kind {kind!r} (valid: {', '.join(SHAPES)})")
    shape, size_arg = SHAPES[kind]
    items = [item.strip() for item in body.split(",")] if body.strip() else []
    args: dict[str, object] = {}
    if size_arg is not None:
        if not items or "=" in items[0]:
            raise ValueError(f"topology spec {spec!r}: {kind} needs {shape}")
        args[size_arg] = _size(spec, kind, items.pop(0), shape)
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"topology spec {spec!r}: expected key=value, got {item!r}")
        args[key.strip()] = value.strip()
    if kind in _LINK_KINDS:
        args.setdefault("bandwidth_Bps", DEFAULT_BANDWIDTH_Bps if bandwidth_Bps is None else bandwidth_Bps)
        args.setdefault("latency_s", DEFAULT_LATENCY_s if latency_s is None else latency_s)
    builder = fat_tree if kind == "dgx" and args.get("nodes", 1) != 1 else TOPOLOGIES[kind]
    if builder is not fat_tree:
        args.pop("nodes", None)  # dgx:1, the lone node
    _check_keys(spec, kind, builder, args)
    params = inspect.signature(builder).parameters
    for key, value in args.items():
        if isinstance(value, str) and not isinstance(params[key].default, str):
            args[key] = _number(spec, key, value)
    try:
        graph = builder(**args)
        check_schema(graph)  # e.g. a zero bandwidth given to a builder that does not check it
    except (TypeError, ValueError) as exc:
        raise ValueError(f"topology spec {spec!r}: {exc}") from None
    return graph


def _size(spec: str, kind: str, text: str, shape: str):
    if kind in ("torus", "mesh"):
        if not re.fullmatch(r"\d+(x\d+){0,2}", text):
            raise ValueError(f"topology spec {spec!r}: {kind} needs {shape} (1 to 3 axes), got {text!r}")
        return tuple(int(k) for k in text.split("x"))
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"topology spec {spec!r}: {kind} needs {shape} (an integer >= 1), got {text!r}")
    return int(text)


def _number(spec: str, key: str, text: str) -> int | float:
    """A plain SI number (options whose default is a word, e.g. load_balance=adaptive, stay words)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"topology spec {spec!r}: {key}={text!r} is not a number (plain SI, e.g. 5e10)") from None


def _check_keys(spec: str, kind: str, builder, args: dict) -> None:
    params = inspect.signature(builder).parameters
    valid = [name for name in params if name != SHAPES[kind][1]]
    for key in args:
        if key not in params:
            raise ValueError(f"topology spec {spec!r}: unknown option {key!r} for {kind} (valid: {', '.join(valid)})")
    missing = [name for name, p in params.items() if p.default is inspect.Parameter.empty and name not in args]
    if missing:
        raise ValueError(f"topology spec {spec!r}: {kind} needs {', '.join(missing)}")
