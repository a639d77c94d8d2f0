"""Fixed-width text tables (terminal summaries, nccl-tests-style results) and the time unit a figure shows."""

from __future__ import annotations

from numbers import Number


def format_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """Render `rows` as a text table; `columns` are (key, header, format spec).

    Example column: ("time_s", "time (s)", ".3f").

    Numeric columns (every present value a number) are right-aligned, others left-aligned; a missing
    key prints "-". Columns are separated by two spaces; lines carry no trailing blanks.
    """
    cells = [[_cell(row.get(key), spec) for key, _, spec in columns] for row in rows]
    headers = [header for _, header, _ in columns]
    numeric = [
        all(isinstance(row.get(key), Number) for row in rows if row.get(key) is not None) for key, _, _ in columns
    ]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: list[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(parts).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _cell(value, spec: str) -> str:
    if value is None:
        return "-"
    return format(value, spec)


def time_unit(makespan_s: float) -> tuple[str, float]:
    """(unit name, factor from seconds) for an axis that spans `makespan_s`."""
    if makespan_s < 1e-3:
        return "us", 1e6
    if makespan_s < 1.0:
        return "ms", 1e3
    return "s", 1.0
