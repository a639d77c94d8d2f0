"""Errors for bad scenario input: one line, naming the file, the YAML path and what is wrong."""

from __future__ import annotations

import re
from pathlib import Path


def _escape_controls(text: str) -> str:
    """Control characters (line breaks, tabs, ...) as Python escapes, so the text stays on one line."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: repr(m.group())[1:-1], text)


SHOWN_CHARS = 80  # a value quoted in an error is cut to this many characters
_MAX_PATH_CHARS = 200  # a field path (a key may be a long string) is cut too
_MAX_REASON_CHARS = 400


def clip(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text`, cut to `limit` characters with '...' when longer."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ScenarioError(Exception):
    """Bad scenario input. str(err) is one line: `{file}: {path}: {reason}`."""

    def __init__(self, file: str | Path, path: str, reason: str):
        # one line, always: a key or file name may itself hold a line break; and short, always
        self.file, self.path = _escape_controls(str(file)), clip(_escape_controls(path), _MAX_PATH_CHARS)
        self.reason = clip(" ".join(str(reason).split()), _MAX_REASON_CHARS)
        super().__init__(f"{self.file}: {self.path}: {self.reason}")


class FieldError(ValueError):
    """Raised inside a validator to blame `subpath` (relative to the validated model)."""

    def __init__(self, subpath: str, reason: str):
        super().__init__(reason)
        self.subpath = tuple(subpath.split("."))


def key_text(key: object) -> str:
    """A mapping key (or a path part) as text for a field path: a str cut to SHOWN_CHARS, else
    show_value's form (a key may be an int of 10^5 digits, whose str() Python refuses)."""
    return clip(key) if isinstance(key, str) else show_value(key)


def show_value(value: object) -> str:
    """A value as the user wrote it in YAML, at most SHOWN_CHARS characters. Cheap for any value:
    a container is named, never printed; a long string or a huge integer is cut before repr/str."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, str):
        return clip(repr(value[: SHOWN_CHARS + 1]))
    if isinstance(value, int) and value.bit_length() > 200:  # str() of a 10^5-digit int is slow or refused
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    if isinstance(value, (int, float)):
        return clip(str(value))
    return clip(f"a {type(value).__name__}")
