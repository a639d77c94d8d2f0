"""The cyclic garbage collector paused while a run makes objects by the million.

A run builds hundreds of thousands of ops, walks them into millions of spans and events, and
summarises those: objects that live to the end, which the collector would rescan again and again
while they are made (half the walk's time on a long pipeline), where reference counting frees the
short-lived ones anyway.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused(keep: bool = True) -> Iterator[None]:
    """The block runs with the collector off. `keep`: what it made lives on (a program, a run's
    records), so at the end the survivors are moved out of the collector's sight (gc.freeze), or
    its first pass after would scan them all once more; else it made garbage (the preflight's
    sample programs), freed by reference counting, and nothing is frozen."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if keep:
            gc.freeze()
        if was_enabled:
            gc.enable()
