"""Errors for bad scenario input: one line, naming the file, the YAML path and what is wrong."""

from __future__ import annotations

import re
from pathlib import Path


def _escape_controls(text: str) -> str:
    """Control characters (line breaks, tabs, ...) as Python escapes, so the text stays on one line."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: repr(m.group())[1:-1], text)


class ScenarioError(Exception):
    """Bad scenario input. str(err) is one line: `{file}: {path}: {reason}`."""

    def __init__(self, file: str | Path, path: str, reason: str):
        # one line, always: a key or file name may itself hold a line break
        self.file, self.path = _escape_controls(str(file)), _escape_controls(path)
        self.reason = " ".join(str(reason).split())
        super().__init__(f"{self.file}: {self.path}: {self.reason}")


class FieldError(ValueError):
    """Raised inside a validator to blame `subpath` (relative to the validated model)."""

    def __init__(self, subpath: str, reason: str):
        super().__init__(reason)
        self.subpath = tuple(subpath.split("."))


def show_value(value: object) -> str:
    """A value as the user wrote it in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."
