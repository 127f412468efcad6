"""``paused_gc``: the cyclic garbage collector off while a large IR is built or planned.

Transforms and the simulator allocate hundreds of thousands of small, long-lived objects (values,
ops, types, plan records) and free almost none of them while they work. Each allocation burst
makes CPython run generation collections that walk the ever-growing heap and find nothing: on
the 1024-device GPT-3 program that is about a third of ``distribute``. Reference counting still
frees everything acyclic at once; cycles made meanwhile are collected when the collector is back
on. Nesting is safe: only the outermost pause turns the collector back on.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Turn the cyclic collector off for the block, restoring its previous state after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
