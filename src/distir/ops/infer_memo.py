"""``abstract_types``: an op's result types on abstract arguments (no known value), memoized on
frozen values. An op's result types are a pure function of its rules, its attributes and its
argument types, and a search infers the same layer functions again and again: differentiating
and sharding them, planning them on each TP group and device kind, splitting a backward for the
zero-bubble schedules, and (``distir.ops.dtensor_inference``) the same global view of an op for
every tensor-parallel degree and sequence-parallel layout. Only answers are stored, never
failures; ``MEMO_TYPES = False`` infers every op anew (the reference the tests compare with)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from distir.ir.types import Type
from distir.ir.values import Attrs

if TYPE_CHECKING:
    from distir.ops.registry import OpDef

# (op name, its kind, its type rule and sharding rule, attributes, argument types) -> result types.
# Bounded: cleared when full.
_INFERRED: dict[tuple[object, ...], tuple[Type, ...]] = {}
_INFERRED_MAX = 1 << 15
MEMO_TYPES = True


def abstract_types(d: OpDef, attrs: Attrs, types: Sequence[Type]) -> tuple[Type, ...]:
    """``d.infer_types(types, attrs, no known values)``, memoized (module docstring)."""
    if not MEMO_TYPES:
        return d.infer_types(list(types), attrs, [None] * len(types))
    key = (d.name, d.kind, d.infer, d.sharding, attrs, *types)
    got = _INFERRED.get(key)
    if got is None:
        got = d.infer_types(list(types), attrs, [None] * len(types))
        if len(_INFERRED) >= _INFERRED_MAX:
            _INFERRED.clear()
        _INFERRED[key] = got
    return got


__all__ = ["MEMO_TYPES", "abstract_types"]
