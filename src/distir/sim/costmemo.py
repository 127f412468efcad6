"""Cost memos shared by every planning domain on equal cost models.

A planning domain (``distir.sim.units.Units``) memoizes what the cost model says of an op's
local pieces (``local_costs``: seconds and FLOPs per op, local shapes and GPU class), of a whole
local op on a mesh without its devices (``local_shapes``: ``spmd.local_record``'s mesh-free
part) and of one collective (``comm``: seconds per pattern, bytes and real GPUs). Each of these
is a function of its key and of the cost model alone — its fields and its cluster — never of the
device map, the units or the program (``spmd.local_record``'s docstring says what its key
holds). So domains on equal cost models share one set of memos: the search's probes of one
layer on every GPU group of a kind, and its exact simulations, cost each distinct local op once.

Two cost models are equal here when they are the same object, or frozen ``dataclasses`` of the
same type whose fields are equal — the cluster compared by identity (a cluster is immutable; one
object per parsed cluster), mappings by their items. A model of any other kind, or with a field
that is not hashable, gets memos of its own, per domain (a model that can change after its
first use never shares: its token would no longer say what it is). The memos are bounded
(cleared when full: they are memos, recomputed alike).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = ["CostMemos", "cost_memos", "cost_token"]

_KEPT_MODELS = 16  # distinct cost models whose memos are kept
_KEPT_ENTRIES = 1 << 16  # entries per memo before it is cleared


class CostMemos(NamedTuple):
    """The memos of one cost model (module docstring)."""

    local_costs: dict[tuple[Any, ...], tuple[float, float]]
    local_shapes: dict[tuple[Any, ...], tuple[float, float, bool, tuple[tuple[float, ...], ...]]]
    comm: dict[tuple[Any, ...], float]


class _Kept(NamedTuple):
    """A token's memos, with the cost model and cluster it was made of kept alive (so the ids in
    tokens stay theirs)."""

    alive: object
    memos: CostMemos


class _Token(NamedTuple):
    """A cost model's token, worked out once (the model kept alive so its id stays its own)."""

    model: object
    token: tuple[Any, ...] | None


_MEMOS: dict[tuple[Any, ...], _Kept] = {}
_TOKENS: dict[int, _Token] = {}


def cost_token(cost: object) -> tuple[Any, ...] | None:
    """What makes ``cost`` the cost model it is, as a hashable value (module docstring), or None
    when it is not a frozen dataclass of hashable fields (no memo is shared with it)."""
    if not dataclasses.is_dataclass(cost) or isinstance(cost, type):
        return None
    if not type(cost).__dataclass_params__.frozen:  # type: ignore[attr-defined]
        return None
    parts: list[Any] = [type(cost)]
    for f in dataclasses.fields(cost):
        v = getattr(cost, f.name)
        if f.name == "cluster":
            parts.append(("cluster", id(v)))
            continue
        try:
            if isinstance(v, Mapping):
                v = ("mapping", frozenset(v.items()))
            hash(v)
        except TypeError:
            return None
        parts.append((f.name, v))
    return tuple(parts)


def cost_memos(cost: object) -> CostMemos:
    """The memos every domain on a cost model equal to ``cost`` shares (new ones of its own when
    ``cost_token`` gives none)."""
    seen = _TOKENS.get(id(cost))
    if seen is None or seen.model is not cost:
        if len(_TOKENS) >= 4 * _KEPT_MODELS:
            _TOKENS.clear()
        seen = _TOKENS[id(cost)] = _Token(cost, cost_token(cost))
    token = seen.token
    if token is None:
        return CostMemos({}, {}, {})
    got = _MEMOS.get(token)
    if got is None:
        if len(_MEMOS) >= _KEPT_MODELS:
            _MEMOS.clear()
        got = _MEMOS[token] = _Kept((cost, getattr(cost, "cluster", None)), CostMemos({}, {}, {}))
    memos = got.memos
    for m in memos:
        if len(m) >= _KEPT_ENTRIES:
            m.clear()
    return memos
