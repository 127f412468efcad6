"""The op registry and the op families. Importing this package registers every op.

A family spread over several modules (``shape``: ``shape_index``, ``shape_grad``; ``conv``:
``conv_grad``) is imported here as a whole; its modules import the family's base module, never
the other way round."""

from distir.ops import (  # noqa: F401  (registration)
    attention,
    comm,
    compare,
    conv,
    conv_grad,
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
    shape_grad,
    shape_index,
    tuples,
)
from distir.ops.registry import REGISTRY, AttrSpec, OpDef, OpKind, OpTypeError, TypeCtx, register

__all__ = ["REGISTRY", "AttrSpec", "OpDef", "OpKind", "OpTypeError", "TypeCtx", "register"]
