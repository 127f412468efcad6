"""The op registry and the op families. Importing this package registers every op.

A family large enough to be a package (``shape``; the gradient ops, ``grad``) registers its
modules from its ``__init__``."""

from distir.ops import (  # noqa: F401  (registration)
    attention,
    comm,
    compare,
    conv,
    dist,
    elementwise,
    float8,
    grad,
    linalg,
    loss,
    moe,
    nn,
    optim,
    rank_comm,
    reduce,
    shape,
    tuples,
)
from distir.ops.registry import REGISTRY, AttrSpec, OpDef, OpKind, OpTypeError, TypeCtx, register

__all__ = ["REGISTRY", "AttrSpec", "OpDef", "OpKind", "OpTypeError", "TypeCtx", "register"]
