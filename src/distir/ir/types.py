"""Types of DistIR values: tensors, scalars and tuples, each tied to a device.

Invariants (checked on construction, so an ill-formed type cannot exist):
- a ``Device`` has a non-negative integer id and prints as ``d<id>``;
- a ``TensorType`` has a known dtype, a shape of non-negative ints and a device;
- a ``ScalarType`` has a dtype and a device;
- a ``TupleType`` holds other types (possibly none).

The tensors, scalars and devices are defined in ``distir.ir.local_types`` and distributed tensors
in ``distir.ir.dtensor`` (both re-exported here); this module closes the hierarchy with tuples
and the ``Type`` union.

All types are frozen, slotted dataclasses with value equality and a short ``__str__`` that is
exactly their text-format spelling, so ``parse_type(str(t)) == t``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

from distir.ir.dtensor import DTensorType
from distir.ir.local_types import _ITEMSIZE, _NUMPY, Device, DType, IRTypeError, ScalarType, TensorType
from distir.limits import MAX_TYPE_NESTING

__all__ = [
    "TYPE_CLASSES",
    "_ITEMSIZE",
    "_NUMPY",
    "DTensorType",
    "DType",
    "Device",
    "IRTypeError",
    "ScalarType",
    "TensorType",
    "TupleType",
    "Type",
    "devices_of",
]


@dataclass(frozen=True, slots=True)
class TupleType:
    """``Tuple[T1, T2, ...]``: a fixed-size group of values (e.g. a layer's weights)."""

    elements: tuple[Type, ...]
    # types nested in this one, itself included (a tensor: 1): at most MAX_TYPE_NESTING, what
    # the parser reads back, so every type a program can hold prints as parseable text
    depth: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.elements, tuple) or not all(
            isinstance(e, TYPE_CLASSES) for e in self.elements
        ):
            raise IRTypeError(f"tuple elements must be types, got {self.elements!r}")
        depth = 1 + max((e.depth if isinstance(e, TupleType) else 1 for e in self.elements), default=0)
        if depth > MAX_TYPE_NESTING:
            raise IRTypeError(f"tuple types nested {depth} deep; distir's bound is {MAX_TYPE_NESTING}")
        object.__setattr__(self, "depth", depth)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.elements)

    def __str__(self) -> str:
        return "Tuple[" + ", ".join(str(e) for e in self.elements) + "]"


Type: TypeAlias = TensorType | ScalarType | TupleType | DTensorType
TYPE_CLASSES: tuple[type, ...] = (TensorType, ScalarType, TupleType, DTensorType)


def devices_of(t: Type) -> tuple[Device, ...]:
    """The distinct devices a value of type ``t`` lives on, in first-seen order."""
    if isinstance(t, DTensorType):
        return t.mesh.devices
    if isinstance(t, TupleType):
        seen: dict[Device, None] = {}
        for e in t.elements:
            for d in devices_of(e):
                seen[d] = None
        return tuple(seen)
    return (t.device,)
