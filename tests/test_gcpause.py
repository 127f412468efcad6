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
