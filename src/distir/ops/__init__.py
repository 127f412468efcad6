"""The op registry and the op families. Importing this package registers every op."""

from distir.ops import (  # noqa: F401  (registration)
    attention,
    comm,
    compare,
    conv,
    dist,
    elementwise,
    grad,
    grad_index,
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
