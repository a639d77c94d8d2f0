"""A progress bar for long runs: ops simulated, ops/s, ETA; on a terminal only, and only once a
run has taken a couple of seconds (tqdm's `delay`), so short runs and pipes stay quiet."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tqdm import tqdm

SHOW_AFTER_S = 2.0


@contextmanager
def op_progress(total_ops: int, label: str) -> Iterator[Callable[[int], None]]:
    """Yield a callback taking the number of ops done so far (the engine's `on_progress`)."""
    bar = tqdm(
        total=total_ops,
        desc=label,
        unit="op",
        unit_scale=True,
        delay=SHOW_AFTER_S,
        leave=False,
        disable=not sys.stderr.isatty(),
        file=sys.stderr,
    )

    def update(done: int) -> None:
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        bar.close()


@contextmanager
def candidate_progress(total: int, done: int, label: str, unit: str = "run") -> Iterator[Callable[..., None]]:
    """A bar over the candidates of a plan or sweep (those already done, from a previous run,
    counted from the start); yield a callback for `n` (default 1) more finished. On a terminal only."""
    bar = tqdm(
        total=total, initial=done, desc=label, unit=unit, leave=True, disable=not sys.stderr.isatty(), file=sys.stderr
    )

    def advance(n: int = 1) -> None:
        bar.update(n)

    try:
        yield advance
    finally:
        bar.close()
