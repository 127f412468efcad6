"""``paused_gc`` turns the cyclic collector off for a block and restores the state it found."""

from __future__ import annotations

import gc

import pytest

from distir.gcpause import paused_gc


@pytest.fixture(autouse=True)
def _restore_gc():  # type: ignore[no-untyped-def]
    was = gc.isenabled()
    yield
    gc.enable() if was else gc.disable()


def test_nested_pauses_turn_the_collector_back_on_only_at_the_outermost() -> None:
    gc.enable()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off_and_errors_restore_the_state() -> None:
    gc.disable()
    with paused_gc():
        pass
    assert not gc.isenabled()
    gc.enable()
    with pytest.raises(RuntimeError), paused_gc():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_promote_moves_what_the_block_left_to_the_oldest_generation_and_frees_its_cycles_later() -> None:
    """``promote``: the block's survivors skip the young collections (they are in the oldest
    generation when the collector is back on); a full collection still frees a cycle it made."""
    import weakref

    class Node:
        pass

    gc.enable()
    gc.collect()
    with paused_gc(promote=True):
        kept = [object.__new__(Node) for _ in range(5000)]  # survivors
        a, b = Node(), Node()
        a.other, b.other = b, a  # type: ignore[attr-defined]  # a cycle, garbage once unnamed
        gone = weakref.ref(a)
        del a, b
    assert gc.isenabled() and gc.get_freeze_count() == 0
    young = {id(o) for o in gc.get_objects(generation=0)} | {id(o) for o in gc.get_objects(generation=1)}
    assert not any(id(o) in young for o in kept)
    assert gone() is not None  # nothing collected it yet
    gc.collect()
    assert gone() is None


def test_promote_leaves_objects_frozen_by_someone_else_frozen() -> None:
    """An object someone froze stays in the permanent generation (the collector's generations,
    ``gc.get_objects()``, do not list it) through a promoting pause. (The freeze count itself is
    no test: frozen objects may be freed meanwhile.)"""
    held = [object()]  # a container, tracked by the collector
    gc.enable()
    gc.freeze()
    try:
        assert not any(o is held for o in gc.get_objects())
        with paused_gc(promote=True):
            pass
        assert gc.get_freeze_count() > 0
        assert not any(o is held for o in gc.get_objects())
    finally:
        gc.unfreeze()
