"""Strict, bounded YAML for scenario files: the PyYAML loader the scenario loader reads with.

Strict: duplicate keys are errors; YAML 1.2 floats ('1e-3' is a float, PyYAML alone reads a str).
Bounded, before anything is built from the text: nesting at most MAX_DEPTH deep, and at most
MAX_NODES values once every alias is expanded (a "billion laughs" file is refused from its few
lines, never expanded), no alias that contains itself. The loader refuses a text longer than
MAX_TEXT_CHARS before it gets here. Every refusal is a yaml.YAMLError with the line and column.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

MAX_TEXT_CHARS = 2**20  # a scenario is a page or two; 1 MiB is far beyond any real one
MAX_DEPTH = 64  # nesting of mappings and lists; real scenarios nest 4 deep
MAX_NODES = 100_000  # values with aliases expanded; real scenarios have a few hundred


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys, reads YAML 1.2 floats ('1e-3' is a float), and
    refuses nesting deeper than MAX_DEPTH and documents of more than MAX_NODES expanded values."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: yaml.Node) -> Any:
        check_expanded_size(node)
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key '{key}'", key_node.start_mark)
            seen.add(key if isinstance(key, str) else id(key_node))
        return super().construct_mapping(node, deep=deep)


StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|\.(?:inf|Inf|INF))$|^\.(?:nan|NaN|NAN)$"
    ),
    list("-+0123456789."),
)


def check_expanded_size(root: yaml.Node) -> None:
    """The number of values `root` holds with every alias expanded, counted on the node graph (an
    alias is the same node object again, so this takes time in the distinct nodes, not the expanded
    ones): over MAX_NODES, or an alias inside itself, is a YAML error at the offending node."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:  # recursion depth <= MAX_DEPTH (compose_node's guard)
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise yaml.composer.ComposerError(
                None, None, "an alias refers to a value that contains it", node.start_mark
            )
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        if total > MAX_NODES:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"more than {MAX_NODES:,} values once aliases are expanded (a scenario has a few hundred)",
                node.start_mark,
            )
        open_nodes.discard(key)
        sizes[key] = total
        return total

    size(root)
