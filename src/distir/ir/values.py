"""SSA values and op attributes.

A ``Value`` is defined exactly once (a function parameter or an op result) and compares by
identity: two values with the same name hint are still different values. The name is only a
hint; the printer makes names unique within a function. A value's type may be unknown (``None``)
until type inference fills it in.

Attribute values are immutable: ints, floats, strings, bools, devices, dtypes and (nested)
tuples of these. Lists given by a caller are frozen into tuples.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias, TypeVar, overload

from distir.ir.types import Device, DType, Type

AttrValue: TypeAlias = "int | float | str | bool | Device | DType | tuple[AttrValue, ...]"


class Value:
    """An SSA value. Identity is the value; ``name`` is a printing hint."""

    __slots__ = ("name", "type")

    def __init__(self, name: str, type: Type | None = None) -> None:
        self.name = name
        self.type = type

    def __repr__(self) -> str:
        t = f": {self.type}" if self.type is not None else ""
        return f"%{self.name}{t}"


def freeze_attr(v: object, where: str = "attribute") -> AttrValue:
    """Turn a caller-supplied attribute value into its immutable form, or raise TypeError."""
    if isinstance(v, bool | int | float | str | Device | DType):
        return v
    if isinstance(v, list | tuple):
        return tuple(freeze_attr(x, where) for x in v)
    raise TypeError(f"{where}: unsupported attribute value {v!r} of type {type(v).__name__}")


_T = TypeVar("_T")


class Attrs(Mapping[str, AttrValue]):
    """An immutable, ordered mapping of attribute names to values, with value equality."""

    __slots__ = ("_hash", "_items", "_map", "_sig")

    def __init__(self, items: Iterable[tuple[str, AttrValue]] | Mapping[str, object] = ()) -> None:
        pairs = items.items() if isinstance(items, Mapping) else items
        frozen = tuple((str(k), freeze_attr(v, f"attribute {k!r}")) for k, v in pairs)
        self._items = frozen
        self._map = dict(frozen)
        self._sig: frozenset[tuple[str, object]] | None = None
        self._hash: int | None = None
        if len(self._map) != len(frozen):
            raise ValueError(f"duplicate attribute names in {[k for k, _ in frozen]}")

    def __getitem__(self, key: str) -> AttrValue:
        return self._map[key]

    # ``Mapping``'s ``get`` and ``in`` go through ``__getitem__`` and a raised KeyError: the
    # planner and the sharding rules ask for absent attributes constantly
    @overload
    def get(self, key: str, /) -> AttrValue | None: ...
    @overload
    def get(self, key: str, default: AttrValue, /) -> AttrValue: ...
    @overload
    def get(self, key: str, default: _T, /) -> AttrValue | _T: ...
    def get(self, key: str, default: Any = None, /) -> Any:
        return self._map.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._map

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._items)

    def items_in_order(self) -> tuple[tuple[str, AttrValue], ...]:
        return self._items

    def signature(self) -> frozenset[tuple[str, object]]:
        """A type-exact, order-independent key: 1, 1.0 and True differ; nan equals nan.
        Computed once (attributes are hashed and compared constantly as parts of cost keys)."""
        sig = self._sig
        if sig is None:
            sig = self._sig = frozenset((k, typed_key(v)) for k, v in self._items)
        return sig

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Attrs):
            return NotImplemented
        return hash(self) == hash(other) and self.signature() == other.signature()

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = self._hash = hash(self.signature())
        return h

    def __repr__(self) -> str:
        return f"Attrs({dict(self._items)!r})"


def typed_key(v: AttrValue) -> object:
    """A hashable key of an attribute value that tells 1, 1.0 and True apart, also in lists."""
    if isinstance(v, tuple):
        return ("list", tuple(typed_key(x) for x in v))
    if isinstance(v, float) and v != v:
        return ("float", "nan")  # nan != nan, but attributes holding nan are equal
    return (type(v).__name__, v)


EMPTY_ATTRS = Attrs()
