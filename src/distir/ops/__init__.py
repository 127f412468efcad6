"""The op registry and the op families. Importing this package registers every op."""

from distir.ops import comm, elementwise, grad, linalg, optim, shape, tuples  # noqa: F401  (registration)
from distir.ops.registry import REGISTRY, AttrSpec, OpDef, OpKind, OpTypeError, TypeCtx, register

__all__ = ["REGISTRY", "AttrSpec", "OpDef", "OpKind", "OpTypeError", "TypeCtx", "register"]
