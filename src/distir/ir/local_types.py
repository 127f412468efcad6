"""Types of values on one device: element types (``DType``), devices, tensors and scalars.

The shared base of the type hierarchy: ``distir.ir.dtensor`` (distributed tensors) and
``distir.ir.types`` (tuples and the ``Type`` union over all of them) build on it; import these
names from ``distir.ir.types`` (or ``distir.ir``), which re-exports them.

Invariants (checked on construction, so an ill-formed type cannot exist):
- a ``Device`` has a non-negative integer id and prints as ``d<id>``;
- a ``TensorType`` has a known dtype, a shape of non-negative ints and a device;
- a ``ScalarType`` has a dtype and a device.
"""

from __future__ import annotations

import builtins
import math
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from distir.limits import MAX_ELEMENTS, over


class IRTypeError(ValueError):
    """A type (or a piece of one) was constructed with invalid components."""


class DType(Enum):
    """Element types. The value is the text-format spelling."""

    f16 = "f16"
    bf16 = "bf16"
    f8e4m3 = "f8e4m3"  # float8 E4M3 (OCP "e4m3fn": max 448, no infinities)
    f8e5m2 = "f8e5m2"  # float8 E5M2 (max 57344)
    f32 = "f32"
    f64 = "f64"
    i8 = "i8"
    i16 = "i16"
    i32 = "i32"
    i64 = "i64"
    bool = "bool"

    # members are singletons that compare by identity: hashed by it at C speed (``Enum.__hash__``
    # hashes the member's name in Python, and dtypes key the simulator's memos)
    __hash__ = object.__hash__

    def __str__(self) -> str:
        return self.value

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> builtins.bool:
        return self in (DType.f16, DType.bf16, DType.f32, DType.f64, DType.f8e4m3, DType.f8e5m2)

    @property
    def is_float8(self) -> builtins.bool:
        """A float8 type: a tensor scaled into its range (``FP8_MAX``) and multiplied on the
        GPU's FP8 tensor cores; the reference holds it as the float32 values it stands for."""
        return self in (DType.f8e4m3, DType.f8e5m2)

    @property
    def is_int(self) -> builtins.bool:
        return self in (DType.i8, DType.i16, DType.i32, DType.i64)

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
            if np.dtype(name) == dt and d not in (DType.bf16, DType.f8e4m3, DType.f8e5m2):
                return d
        raise IRTypeError(f"numpy dtype {dt} has no DistIR dtype")


_ITEMSIZE = {
    DType.f16: 2,
    DType.bf16: 2,
    DType.f8e4m3: 1,
    DType.f8e5m2: 1,
    DType.f32: 4,
    DType.f64: 8,
    DType.i8: 1,
    DType.i16: 2,
    DType.i32: 4,
    DType.i64: 8,
    DType.bool: 1,
}
_NUMPY = {
    DType.f16: "float16",
    DType.bf16: "float32",
    DType.f8e4m3: "float32",
    DType.f8e5m2: "float32",
    DType.f32: "float32",
    DType.f64: "float64",
    DType.i8: "int8",
    DType.i16: "int16",
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
        n = math.prod(shape)
        if n > MAX_ELEMENTS.max:
            raise IRTypeError(over(f"tensor shape {shape}: its elements", n, MAX_ELEMENTS))
        # types are hashed constantly (cost and call-summary keys): hash once
        object.__setattr__(self, "_hash", hash((self.dtype.value, self.shape, self.device.id)))
        object.__setattr__(self, "_nbytes", n * _ITEMSIZE[self.dtype])

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
