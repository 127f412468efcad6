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
def paused_gc(promote: bool = False) -> Iterator[None]:
    """Turn the cyclic collector off for the block, restoring its previous state after.

    ``promote``: the objects the block leaves alive (and any cycles it made) go straight to the
    oldest generation when the collector is back on (``gc.freeze`` then ``gc.unfreeze``), instead
    of being walked by the first young collection after it: a block that leaves large caches alive
    (a search's) does not pay for one more walk of them. A later full collection frees its
    cycles. Only when nothing else holds objects frozen (``gc.get_freeze_count``)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if promote and gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()
