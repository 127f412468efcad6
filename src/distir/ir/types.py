"""Types of DistIR values: tensors, scalars and tuples, each tied to a device.

Invariants (checked on construction, so an ill-formed type cannot exist):
- a ``Device`` has a non-negative integer id and prints as ``d<id>``;
- a ``TensorType`` has a known dtype, a shape of non-negative ints and a device;
- a ``ScalarType`` has a dtype and a device;
- a ``TupleType`` holds other types (possibly none).

All types are frozen, slotted dataclasses with value equality and a short ``__str__`` that is
exactly their text-format spelling, so ``parse_type(str(t)) == t``.
"""

from __future__ import annotations

import builtins
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import TypeAlias

import numpy as np

from distir.limits import MAX_TYPE_NESTING


class IRTypeError(ValueError):
    """A type (or a piece of one) was constructed with invalid components."""


class DType(Enum):
    """Element types. The value is the text-format spelling."""

    f16 = "f16"
    bf16 = "bf16"
    f32 = "f32"
    f64 = "f64"
    i8 = "i8"
    i32 = "i32"
    i64 = "i64"
    bool = "bool"

    def __str__(self) -> str:
        return self.value

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> builtins.bool:
        return self in (DType.f16, DType.bf16, DType.f32, DType.f64)

    @property
    def is_int(self) -> builtins.bool:
        return self in (DType.i8, DType.i32, DType.i64)

    def to_numpy(self) -> np.dtype[np.generic]:
        """The numpy dtype the reference executor computes in (bf16 computes in f32)."""
        return np.dtype(_NUMPY[self])

    @staticmethod
    def parse(text: str) -> DType:
        try:
            return DType(text)
        except ValueError:
            known = ", ".join(d.value for d in DType)
            raise IRTypeError(f"unknown dtype {text!r}; known dtypes: {known}") from None

    @staticmethod
    def from_numpy(dt: np.dtype[np.generic]) -> DType:
        for d, name in _NUMPY.items():
            if np.dtype(name) == dt and d is not DType.bf16:
                return d
        raise IRTypeError(f"numpy dtype {dt} has no DistIR dtype")


_ITEMSIZE = {
    DType.f16: 2,
    DType.bf16: 2,
    DType.f32: 4,
    DType.f64: 8,
    DType.i8: 1,
    DType.i32: 4,
    DType.i64: 8,
    DType.bool: 1,
}
_NUMPY = {
    DType.f16: "float16",
    DType.bf16: "float32",
    DType.f32: "float32",
    DType.f64: "float64",
    DType.i8: "int8",
    DType.i32: "int32",
    DType.i64: "int64",
    DType.bool: "bool",
}


@dataclass(frozen=True, slots=True, order=True)
class Device:
    """One device of the cluster (a GPU, a GPU's communication stream, a CPU rank)."""

    id: int

    def __post_init__(self) -> None:
        if not isinstance(self.id, int) or isinstance(self.id, bool) or self.id < 0:
            raise IRTypeError(f"device id must be a non-negative int, got {self.id!r}")

    def __str__(self) -> str:
        return f"d{self.id}"

    def __repr__(self) -> str:
        return f"Device({self.id})"


@dataclass(frozen=True, slots=True)
class TensorType:
    """``Tensor[dtype, shape, device]``; a 0-d tensor has shape ``()``."""

    dtype: DType
    shape: tuple[int, ...]
    device: Device
    _hash: int = field(init=False, repr=False, compare=False)
    _nbytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if type(self.dtype) is not DType:
            raise IRTypeError(f"tensor dtype must be a DType, got {self.dtype!r}")
        shape = self.shape
        if type(shape) is not tuple or not all(type(s) is int and s >= 0 for s in shape):
            raise IRTypeError(f"tensor shape must be a tuple of non-negative ints, got {self.shape!r}")
        if type(self.device) is not Device:
            raise IRTypeError(f"tensor device must be a Device, got {self.device!r}")
        # types are hashed constantly (cost and call-summary keys): hash once
        object.__setattr__(self, "_hash", hash((self.dtype.value, self.shape, self.device.id)))
        object.__setattr__(self, "_nbytes", math.prod(shape) * _ITEMSIZE[self.dtype])

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[TensorType], tuple[DType, tuple[int, ...], Device]]:
        # rebuild on unpickling: str hashes differ between processes, so _hash must be recomputed
        return (TensorType, (self.dtype, self.shape, self.device))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def with_device(self, device: Device) -> TensorType:
        return TensorType(self.dtype, self.shape, device)

    def __str__(self) -> str:
        if len(self.shape) == 1:
            shape = f"({self.shape[0]},)"
        else:
            shape = "(" + ", ".join(str(s) for s in self.shape) + ")"
        return f"Tensor[{self.dtype}, {shape}, {self.device}]"


@dataclass(frozen=True, slots=True)
class ScalarType:
    """``Scalar[dtype, device]``: a single number living on a device."""

    dtype: DType
    device: Device

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, DType):
            raise IRTypeError(f"scalar dtype must be a DType, got {self.dtype!r}")
        if not isinstance(self.device, Device):
            raise IRTypeError(f"scalar device must be a Device, got {self.device!r}")

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize

    def with_device(self, device: Device) -> ScalarType:
        return ScalarType(self.dtype, device)

    def __str__(self) -> str:
        return f"Scalar[{self.dtype}, {self.device}]"


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


# DTensorType (distributed tensors on a mesh) lives in its own module, which builds on this one
from distir.ir.dtensor import DTensorType  # noqa: E402

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
