"""The enums that key the simulator's memos (``DType``, ``OpKind``, ``CommPattern``) hash their
members by identity: the same dictionary and set behaviour as ``Enum``'s own hash of the name."""

from __future__ import annotations

import copy
import pickle
from enum import Enum

import pytest

from distir.ir.types import DType
from distir.ops.registry import CommPattern, OpKind


@pytest.mark.parametrize("kind", [DType, OpKind, CommPattern])
def test_members_key_dicts_as_enum_members_do(kind: type[Enum]) -> None:
    members = list(kind)
    by_member = {m: i for i, m in enumerate(members)}
    for i, m in enumerate(members):
        # a member met again (copied, pickled: the same object) finds its entry
        for again in (m, copy.copy(m), copy.deepcopy(m), pickle.loads(pickle.dumps(m)), kind(m.value)):
            assert again is m
            assert hash(again) == hash(m)
            assert by_member[again] == i
        # the keys Enum's own hash would give pick out the same members
        assert {Enum.__hash__(x) for x in members if x == m} == {Enum.__hash__(m)}
    assert len(set(members)) == len(members)
    assert set(members) == {pickle.loads(pickle.dumps(m)) for m in members}
